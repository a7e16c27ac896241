"""The one exception type the CLI turns into a single clear line (no traceback)."""


class AttnlabError(Exception):
    """A user-facing error: bad config, bad data, bad checkpoint. The message is the whole story."""
