"""Pure request/response translation between the Responses API and upstream APIs (no I/O)."""
