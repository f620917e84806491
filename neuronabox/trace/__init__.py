"""Traces: the schema, its reader and writer, the summary, and the exports."""
