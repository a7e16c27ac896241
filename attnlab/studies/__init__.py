"""attnlab.studies."""
