"""attnlab's own error types: the CLI turns these (and only these) into one clear line.

Anything else that escapes a command is a bug and keeps its traceback.
"""


class AttnlabError(Exception):
    """A user-facing error: bad config, bad data, bad checkpoint. The message is the whole story."""


class ConfigError(AttnlabError, ValueError):
    """An invalid setting (config field, option value). Also a ``ValueError``, as it always was."""
