"""Reports over the history store: terminal tables, JSON and HTML with SVG plots."""
