"""The one chart drawer (report/svg.py): round ticks, labels that do not overlap, every line visible.

These read the SVG the way a browser lays it out at font-size 11: a label of n characters is taken
to be n x CHAR_W pixels wide (generous for sans-serif digits), and the rotated axis title occupies
x in [13 - 7, 13 + 7].
"""

import re
import time

from slurm_horus.report import svg

TEXT = re.compile(r'<text x="([0-9.]+)" y="([0-9.]+)"([^>]*)>([^<]*)</text>')


def texts(chart):
    return [(float(x), float(y), attrs, body) for x, y, attrs, body in TEXT.findall(chart)]


def y_tick_labels(chart):
    return [(x, body) for x, _y, attrs, body in texts(chart) if 'text-anchor="end"' in attrs and 'fill="#333"' in attrs]


def x_tick_labels(chart):
    return [(x, body) for x, _y, attrs, body in texts(chart) if 'text-anchor="middle"' in attrs
            and 'fill="#333"' in attrs]


def test_ticks_are_round_numbers_with_only_the_digits_they_need():
    for top, expected in ((0.359375, ["0", "0.1", "0.2", "0.3", "0.4"]), (100, ["0", "25", "50", "75", "100"]),
                          (16384, ["0", "5k", "10k", "15k", "20k"]), (1.61694, ["0", "0.5", "1.0", "1.5", "2.0"])):
        ticks, step = svg.nice_ticks(0, top, 4)
        assert svg.axis_labels(ticks, step) == expected


def test_memory_axis_labels_never_reach_the_axis_title():
    chart = svg.line_chart([("n1:0", [(0, 16384.0), (10, 12000.0)])], y_label="GPU memory (MiB)", y_max=16384)
    labels = y_tick_labels(chart)
    assert labels
    for right_edge, body in labels:
        assert right_edge - len(body) * svg.CHAR_W > 13 + 7, (right_edge, body)


def test_time_axis_has_clock_ticks_not_just_its_ends():
    start = time.mktime((2026, 1, 5, 13, 30, 43, 0, 0, -1))
    chart = svg.line_chart([("n1:0", [(start + t, 50.0) for t in range(0, 29)])], x_kind="epoch", y_max=100)
    labels = [body for _x, body in x_tick_labels(chart)]
    assert len(labels) >= 4 and all(re.fullmatch(r"\d\d:\d\d:\d\d", body) for body in labels), labels
    assert "2026-01-05, local time" in chart
    xs = [x for x, _ in x_tick_labels(chart)]
    assert all(b - a >= 8 * svg.CHAR_W for a, b in zip(xs, xs[1:]))  # no two labels overlap


def test_equal_lines_are_drawn_once_and_named_together_and_a_lone_point_shows():
    same = [(0, 0.0), (1, 0.0), (2, 0.0)]
    chart = svg.line_chart([("n1:2", same), ("n1:3", list(same)), ("lone", [(0, None), (1, 40.0), (2, None)])])
    assert chart.count("<path") == 1 and "n1:2 = n1:3" in chart
    assert chart.count("<circle") == 1  # the point with gaps on both sides


def test_later_lines_are_dashed_so_a_line_lying_on_another_stays_visible():
    chart = svg.line_chart([("a", [(0, 1.0), (1, 2.0)]), ("b", [(0, 1.0), (1, 2.5)])])
    paths = re.findall(r"<path [^>]*>", chart)
    assert "stroke-dasharray" not in paths[0] and 'stroke-dasharray="6,3"' in paths[1]


def test_bars_and_timelines_label_without_overlap():
    bars = svg.bar_chart([(f"a-rather-long-user-name-{i}", i) for i in range(12)], y_label="GPU-hours")
    assert "rotate(-35" in bars  # long names are slanted instead of running into each other
    start = time.mktime((2026, 1, 5, 9, 0, 0, 0, 0, -1))
    gantt = svg.timeline_chart([("job 1", start, start + 5400), ("job 2", start + 600, start + 7200)])
    labels = [body for _x, body in x_tick_labels(gantt)]
    assert len(labels) >= 3 and all(re.fullmatch(r"\d\d:\d\d", body) for body in labels), labels


def test_no_data_is_said_in_one_line():
    assert "no data" in svg.line_chart([("a", [(0, None)])], title="t")
    assert "no data" in svg.bar_chart([], title="t")
