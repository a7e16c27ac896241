"""attnlab's own error types: the CLI turns these (and only these) into one clear line.

Anything else that escapes a command is a bug and keeps its traceback.
"""


class AttnlabError(Exception):
    """A user-facing error: bad config, bad data, bad checkpoint. The message is the whole story."""


class ConfigError(AttnlabError, ValueError):
    """An invalid setting (config field, option value). Also a ``ValueError``, as it always was."""


def reason(error: BaseException) -> str:
    """The first non-blank line of ``error``'s message, to quote in a one-line refusal.

    A message can be empty, or start with a line break (safetensors' refusal of shared tensors
    does), and a blank quote hides the cause: then the error's type is named, with the error it
    was raised from (or during), if any, the same way.
    """
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if lines:
        return lines[0]
    under = error.__cause__ or error.__context__
    if under is None:
        return type(error).__name__
    inner = reason(under)
    named = inner if inner == type(under).__name__ else f"{type(under).__name__}: {inner}"
    return f"{type(error).__name__} ({named})"
