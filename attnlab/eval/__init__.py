"""attnlab.eval."""
