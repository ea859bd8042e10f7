"""sbatch 22.05's option grammar and the two tokenizers that feed it (command line, #SBATCH lines).

The table below was taken from the real ``sbatch`` 22.05.8 by probing every name with and without an
argument (``option '--x' requires an argument`` / ``doesn't allow an argument``), not from the docs,
which miss some (``--prefer``, ``--ntasks-per-gpu``) and list others sbatch does not take.

Parsing follows getopt_long with sbatch's leading ``+``: options end at the first non-option
argument (the script) or ``--``; a long name may be abbreviated to any unique prefix; an optional
argument is only taken in ``--name=value`` form. Unknown options are kept as they are (sbatch will
report them); an unknown ``--name`` is assumed to take no separate argument.
"""

REQUIRED, OPTIONAL, NONE = "required", "optional", "none"

_REQUIRED_NAMES = """
account acctg-freq array batch bb bbf begin chdir cluster cluster-constraint clusters comment
constraint container core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task deadline
delay-boot dependency distribution error exclude export export-file extra-node-info gid gpu-bind
gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task gres gres-flags hint input job-name
kill-on-invalid-dep licenses mail-type mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu
mincpus network nodefile nodelist nodes ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node
ntasks-per-socket open-mode output partition power prefer priority profile qos reservation signal
sockets-per-node switches tasks-per-node thread-spec threads-per-core time time-min tmp uid
wait-all-nodes wckey wrap
"""
_NO_ARGUMENT_NAMES = """
contiguous help hold ignore-pbs no-requeue overcommit oversubscribe parsable quiet reboot requeue
spread-job test-only usage use-min-nodes verbose version wait
"""
_OPTIONAL_NAMES = "exclusive get-user-env nice no-kill propagate"

LONG_OPTIONS = {}
for _names, _kind in ((_REQUIRED_NAMES, REQUIRED), (_NO_ARGUMENT_NAMES, NONE), (_OPTIONAL_NAMES, OPTIONAL)):
    for _name in _names.split():
        LONG_OPTIONS[_name] = _kind

# short letter -> long name (all of these take the long option's argument kind, except -k: none)
SHORT_OPTIONS = {
    "a": "array", "A": "account", "b": "begin", "B": "extra-node-info", "c": "cpus-per-task",
    "C": "constraint", "d": "dependency", "D": "chdir", "e": "error", "F": "nodefile", "G": "gpus",
    "h": "help", "H": "hold", "i": "input", "J": "job-name", "k": "no-kill", "L": "licenses",
    "m": "distribution", "M": "clusters", "n": "ntasks", "N": "nodes", "o": "output",
    "O": "overcommit", "p": "partition", "q": "qos", "Q": "quiet", "s": "oversubscribe",
    "S": "core-spec", "t": "time", "v": "verbose", "V": "version", "w": "nodelist", "W": "wait",
    "x": "exclude",
}
_SHORT_NO_ARGUMENT = set("hHkOQsvVW")

# Aliases that getopt maps to the same option (sbatch treats them alike).
CANONICAL = {"cluster": "clusters", "tasks-per-node": "ntasks-per-node"}


class Option:
    """One option as the user wrote it: ``name`` is the canonical long name (None if unknown),
    ``value`` its argument (None if none), ``tokens`` the exact argv words it occupied."""

    __slots__ = ("name", "value", "tokens", "source", "span")

    def __init__(self, name, value, tokens, source="", span=None):
        self.name = name
        self.value = value
        self.tokens = tuple(tokens)
        self.source = source
        # (first, last + 1) argv word indexes; short options written as one word share it
        self.span = span

    def __repr__(self):
        return f"Option({self.name!r}, {self.value!r}, {self.tokens!r}, {self.source!r})"

    def __eq__(self, other):
        return isinstance(other, Option) and (self.name, self.value, self.tokens) == (
            other.name, other.value, other.tokens)


def resolve_long(name):
    """Canonical long option for ``name`` (exact or unique prefix, as getopt_long), else None."""
    if name in LONG_OPTIONS:
        return CANONICAL.get(name, name)
    matches = {CANONICAL.get(full, full) for full in LONG_OPTIONS if full.startswith(name)}
    if len(matches) == 1:
        return matches.pop()
    return None


def split_options(argv, source="command line", extra_long=None):
    """Split argv into (options, rest) the way sbatch's getopt does.

    ``rest`` starts at the first non-option word (the script, or ``:`` for a het job); ``--`` is
    dropped from neither list but ends the options (it stays at the head of ``rest``).
    ``extra_long`` maps additional long names (horus-sbatch's own) to their argument kind; those
    must be spelled in full.
    """
    extra_long = extra_long or {}
    options = []
    index = 0
    while index < len(argv):
        word = argv[index]
        if word == "--" or not word.startswith("-") or word == "-":
            break
        if word.startswith("--"):
            body = word[2:]
            name, has_equals, value = body.partition("=")
            if name in extra_long:
                canonical, kind = "horus:" + name, extra_long[name]
            else:
                canonical = resolve_long(name)
                kind = LONG_OPTIONS.get(canonical) if canonical else None
            if kind == REQUIRED and not has_equals:
                if index + 1 < len(argv):
                    options.append(Option(canonical, argv[index + 1], argv[index:index + 2], source,
                                          (index, index + 2)))
                    index += 2
                    continue
                options.append(Option(canonical, None, [word], source, (index, index + 1)))
                index += 1
                continue
            options.append(Option(canonical, value if has_equals else None, [word], source,
                                  (index, index + 1)))
            index += 1
            continue
        # a cluster of short options: -HN2, -N 2, -vv
        position = 1
        members = []
        end = index + 1
        while position < len(word):
            letter = word[position]
            long_name = SHORT_OPTIONS.get(letter)
            if long_name is None or letter in _SHORT_NO_ARGUMENT:
                members.append(Option(long_name, None, ["-" + letter], source))
                position += 1
                continue
            rest = word[position + 1:]
            if rest:
                members.append(Option(long_name, rest, ["-" + letter + rest], source))
            elif index + 1 < len(argv):
                members.append(Option(long_name, argv[index + 1], ["-" + letter, argv[index + 1]], source))
                end = index + 2
            else:
                members.append(Option(long_name, None, ["-" + letter], source))
            break
        for member in members:
            member.span = (index, end)
        options.extend(members)
        index = end
    return options, list(argv[index:])


class DirectiveError(ValueError):
    """A directive line sbatch itself would reject (it prints its own error)."""


def directive_words(text):
    """Split the text after ``#SBATCH`` into [(value, raw)] as sbatch's get_argument does.

    Whitespace separates words; single or double quotes group; a backslash takes the next character
    literally; an unquoted, unescaped ``#`` starts a comment. ``raw`` is the word as written.
    """
    words = []
    position = 0
    length = len(text)
    while True:
        while position < length and text[position] in " \t\n\v\f\r":
            position += 1
        if position >= length:
            return words
        start = position
        value = []
        quote = None
        escaped = False
        while position < length and (quote or text[position] not in " \t\n\v\f\r"):
            char = text[position]
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
                position += 1
                continue
            elif quote:
                if char == quote:
                    quote = None
                    position += 1
                    continue
            elif char in "\"'":
                quote = char
                position += 1
                continue
            elif char == "#":
                break
            value.append(char)
            position += 1
        if quote:
            raise DirectiveError(f"unmatched {quote}")
        if not value:
            # sbatch's get_argument returns nothing for an empty word, which ends the line
            return words
        words.append(("".join(value), text[start:position]))
        if position < length and text[position] == "#":
            return words


def without(argv, options, drop):
    """``argv``'s option words with every option for which ``drop(option)`` is true taken out.

    Words holding only kept options are copied verbatim; a short-option word that mixes kept and
    dropped letters (``-HG2``) is rewritten from the kept ones (``-H``).
    """
    words = []
    groups = {}
    order = []
    for option in options:
        if option.span not in groups:
            groups[option.span] = []
            order.append(option.span)
        groups[option.span].append(option)
    for span in order:
        members = groups[span]
        kept = [member for member in members if not drop(member)]
        if len(kept) == len(members):
            words.extend(argv[span[0]:span[1]])
        else:
            for member in kept:
                words.extend(member.tokens)
    return words
