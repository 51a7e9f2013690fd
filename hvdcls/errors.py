"""Exit statuses and the one exception type that means "the user can fix this"."""

EXIT_OK = 0
EXIT_FAILURE = 1  # a bug or an environment failure: traceback allowed
EXIT_USER_ERROR = 2  # bad input: one line, no traceback


class UserError(Exception):
    """A mistake the user can fix (bad flag, missing package, unreachable host).

    The CLI prints it as a single `hvdcls: error: ...` line and exits with status 2.
    """


class JobStopped(Exception):
    """Horovod stopped the job (a stalled rank, a failed peer): one line, exit status 1."""
