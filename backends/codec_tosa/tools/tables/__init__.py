"""`codec-tosa tables`: collect (figures), render (Markdown), charts (PNG), command (CLI)."""
