"""What a run writes and reads back: atomic writes that a crash never leaves half-done (fileio),
the user's cache directory (cache), and RUN_DIR/status.json's format and reader (status_file).
Part of the core: no framework."""
