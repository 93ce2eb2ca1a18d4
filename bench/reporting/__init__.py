"""The pieces of bench.report: series (what shares a line), tables, plots, and the document renderers."""
