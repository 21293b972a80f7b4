"""The dashboard's routers, one per resource: runs, timeline, analyses, compare, live, page."""
