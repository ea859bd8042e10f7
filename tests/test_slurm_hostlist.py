import pytest

from slurm_horus.errors import InputError
from slurm_horus.hostlist import expand_hostlist


@pytest.mark.parametrize("text, names", [
    ("n[1-3,5]", ["n1", "n2", "n3", "n5"]),
    ("gpu[08-10],login1", ["gpu08", "gpu09", "gpu10", "login1"]),
    ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
    ("n3", ["n3"]),
    ("", []),
])
def test_expand_hostlist(text, names):
    assert expand_hostlist(text) == names


@pytest.mark.parametrize("text", ["n[1-x]", "n[1-3", "n]1["])
def test_bad_hostlist_is_an_input_error(text):
    with pytest.raises(InputError, match="bad hostlist"):
        expand_hostlist(text)
