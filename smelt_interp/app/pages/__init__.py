"""The dashboard's pages, in nav-bar order. Each module has PATH, TITLE, QUERY (its URL keys
and their types, see smelt_interp.app.urls), `layout(wb, state)` (the page for a decoded URL
state) and `register(app, wb)` (its callbacks, kept thin: they fetch cached results from the
Workbench, hand them to the figure functions and write the page's keys back to the URL).
smelt_interp.app.server registers them with Dash's pages mechanism."""

from smelt_interp.app.pages import attention, dyck, overview, routing, runs, similarity

PAGES = (overview, attention, routing, similarity, dyck, runs)
