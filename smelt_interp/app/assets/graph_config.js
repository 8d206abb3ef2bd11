// Client-side callbacks of the dashboard (Dash loads every .js file in assets/ on every page).
window.dash_clientside = Object.assign({}, window.dash_clientside, {
    smelt: {
        // The camera button of every graph on the page downloads the format chosen in the top bar.
        graphConfig: function (fmt, _page) {
            fmt = fmt || 'png';
            // dcc.Graph re-plots only when its figure changes, so also patch the graphs drawn
            // already (Plotly reads toImageButtonOptions when the camera button is clicked).
            document.querySelectorAll('.js-plotly-plot').forEach(gd => {
                if (gd._context) {
                    gd._context.toImageButtonOptions = Object.assign(
                        {}, gd._context.toImageButtonOptions, {format: fmt});
                }
            });
            const outs = (dash_clientside.callback_context.outputs_list || []);
            return outs.map(o => ({displaylogo: false, modeBarButtonsToRemove: ['lasso2d', 'select2d'],
                toImageButtonOptions: {format: fmt, filename: 'smelt-' + o.id.name, scale: 2}}));
        },
    },
});
