"""GRES strings in the shapes Slurm 22.05 prints them."""

import pytest

from slurm_horus.errors import InputError
from slurm_horus.slurm.gres import (
    GresItem, format_index_list, parse_gres, parse_index_list, parse_tres_gres, typed_gpu_indices,
)


@pytest.mark.parametrize("text, expected", [
    ("gpu:g1:1(IDX:1)", [GresItem("gpu", "g1", 1, (1,))]),
    ("shard:g2:1(IDX:2)", [GresItem("shard", "g2", 1, (2,))]),
    ("shard:1(IDX:1)", [GresItem("shard", None, 1, (1,))]),
    ("gres:gpu:2", [GresItem("gpu", None, 2)]),
    ("gres:gpu:g1:1,gres:gpu:g3:1", [GresItem("gpu", "g1", 1), GresItem("gpu", "g3", 1)]),
    ("gpu:3(IDX:0-1,3)", [GresItem("gpu", None, 3, (0, 1, 3))]),
    ("gpu:g0:0(IDX:N/A),gpu:g1:0(IDX:),mps:0",
     [GresItem("gpu", "g0", 0), GresItem("gpu", "g1", 0), GresItem("mps", None, 0)]),
    ("gpu:g0:1(S:0),shard:8", [GresItem("gpu", "g0", 1), GresItem("shard", None, 8)]),
    ("gpu:4(S:0-1,IDX:0-3)", [GresItem("gpu", None, 4, (0, 1, 2, 3))]),
    ("gpu", [GresItem("gpu", None, 1)]),
    ("gpu:tesla", [GresItem("gpu", "tesla", 1)]),
    ("(null)", []),
    ("", []),
    (None, []),
])
def test_parse_gres(text, expected):
    assert parse_gres(text) == expected


@pytest.mark.parametrize("bad", ["gpu:g1:x", "gpu:a:b:c", "gpu:1(IDX:3-1)", "gpu:1(IDX:a)", ":1"])
def test_bad_gres_is_an_error_naming_the_text(bad):
    with pytest.raises(InputError) as info:
        parse_gres(bad)
    assert "GRES" in str(info.value)


def test_index_lists_round_trip():
    assert parse_index_list("0-1,3,5-7") == (0, 1, 3, 5, 6, 7)
    assert format_index_list((7, 0, 1, 3, 5, 6)) == "0-1,3,5-7"
    assert parse_index_list(format_index_list((2,))) == (2,)


def test_str_of_an_item_is_slurm_syntax():
    assert str(GresItem("gpu", "g1", 2, (1, 2))) == "gpu:g1:2(IDX:1-2)"
    assert parse_gres(str(GresItem("shard", "g2", 1, (2,)))) == [GresItem("shard", "g2", 1, (2,))]


def test_tres_string_gres_entries_and_typed_indices():
    items = parse_tres_gres("billing=1,cpu=1,gres/gpu:g0=1,gres/gpu:g3=1,gres/gpu=2,mem=250M,node=1")
    assert items == [GresItem("gpu", "g0", 1), GresItem("gpu", "g3", 1), GresItem("gpu", None, 2)]
    assert typed_gpu_indices(items) == (0, 3)
    assert typed_gpu_indices(parse_tres_gres("cpu=1,gres/shard=1")) == ()
