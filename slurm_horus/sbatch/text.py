"""Text from horusd made safe for one ``#`` comment line or one terminal line."""


def one_line(text):
    """One line of printable ASCII (anything else becomes a space); '' for non-strings."""
    if not isinstance(text, str):
        return ""
    return "".join(c if " " <= c <= "~" else " " for c in text).strip()
