"""Data sources: the built-in synthetic attribute world and loaders for real datasets."""
