"""The one exception the lab raises for conditions a user can fix."""


class LabError(Exception):
    """A failure with a message meant for the user; the CLI prints it without a traceback."""
