"""attnlab.train."""
