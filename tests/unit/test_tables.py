"""hvdcls.tables: the one table renderer."""
from hvdcls import tables


def test_markdown_is_unpadded_pipes():
    assert tables.markdown(["a", "bb"], [["1", "22"], ["333", ""]]) == [
        "| a | bb |", "|---|---|", "| 1 | 22 |", "| 333 |  |"]


def test_text_pads_to_the_widest_cell_and_strips_the_end():
    assert tables.text(["name", "n"], [["x", "10"], ["longer", "2"]], rule=True) == [
        "name    n", "------  --", "x       10", "longer  2"]


def test_text_aligns_right_and_keeps_minimum_widths():
    assert tables.text(["op", "count"], [["A", "3"], ["B", ""]], align="<>", widths=(4, 6), gap=" ") == [
        "op    count", "A         3", "B"]
