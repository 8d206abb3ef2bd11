"""The dashboard's pages. Each module has PATH, TITLE, `layout(wb, state)` (the page for a URL
state) and `register(app, wb)` (its callbacks, kept thin: they fetch cached results from the
Workbench and hand them to the figure functions)."""

from smelt_interp.app.pages import attention, dyck, overview, routing, similarity

PAGES = (overview, attention, routing, similarity, dyck)
