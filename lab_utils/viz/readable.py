"""Does a figure read? Overlapping tick labels, a legend over data, texts on top of each other.

`problems(fig)` draws the figure once with the Agg renderer and measures what was drawn with
matplotlib's own bounding boxes (`get_window_extent(renderer)`, in display pixels), the same
boxes `tight_layout` and `legend(loc="best")` use. It returns one sentence per problem, naming
the Axes and the artists, so a test can `assert problems(fig) == []` and print what to fix.

Boxes are axis-aligned: a rotated label's box is larger than its glyphs, so labels rotated by,
say, 45 degrees may be reported although their letters do not touch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.transforms import Bbox

__all__ = ["overlaps", "problems"]

# two boxes that share less than this many pixels each way only touch
TOUCH_PX = 1.0


def _renderer(fig: Figure):
    """Draw the figure with Agg (attaching an Agg canvas to a bare Figure) and return the renderer."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)  # a Figure() built without pyplot has only a base canvas
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def overlaps(a: Bbox, b: Bbox, tol: float = TOUCH_PX) -> bool:
    """True when the boxes share more than `tol` pixels in both directions."""
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w > tol and h > tol


def _axes_name(ax: Axes, index: int) -> str:
    for loc in ("center", "left", "right"):
        title = ax.get_title(loc=loc)
        if title:
            return f"axes {title!r}"
    label = ax.get_ylabel() or ax.get_xlabel()
    return f"axes {index} ({label!r})" if label else f"axes {index}"


def _artist_name(artist, index: int) -> str:
    label = str(artist.get_label() or "")
    kind = type(artist).__name__
    return f"{kind} {label!r}" if label and not label.startswith("_") else f"{kind} #{index}"


def _shown(text) -> bool:
    return bool(text.get_visible() and text.get_text().strip())


def _tick_labels(axis) -> list:
    """The tick labels the last draw showed: visible, non-empty, at a tick inside the view."""
    lo, hi = sorted(axis.get_view_interval())
    span = (hi - lo) or 1.0
    labels = []
    for tick in axis.get_major_ticks() + axis.get_minor_ticks():
        loc = tick.get_loc()
        if loc is None or not (lo - 1e-9 * span <= loc <= hi + 1e-9 * span):
            continue  # a tick the locator made but the draw left out
        labels += [t for t in (tick.label1, tick.label2) if _shown(t)]
    return labels


def _tick_problems(ax: Axes, name: str, renderer) -> list[str]:
    found = []
    if not ax.axison:  # ax.axis("off"): no tick label is drawn
        return found
    for which, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
        if not axis.get_visible():
            continue
        labels = _tick_labels(axis)
        boxes = [t.get_window_extent(renderer) for t in labels]
        clashes = [
            (labels[i].get_text(), labels[j].get_text())
            for i in range(len(boxes))
            for j in range(i + 1, len(boxes))
            if overlaps(boxes[i], boxes[j])
        ]
        if clashes:
            shown = ", ".join(f"{a!r}/{b!r}" for a, b in clashes[:4])
            more = f" and {len(clashes) - 4} more" if len(clashes) > 4 else ""
            found.append(
                f"{name}: {len(clashes)} pair(s) of {which} tick labels overlap ({shown}{more}); "
                "use fewer ticks, a smaller font, rotation or a wider figure"
            )
    return found


def _line_hits(line, box: Bbox) -> bool:
    """A line's markers inside the box, or (when it is drawn as a line) a segment crossing it."""
    import numpy as np

    path = line.get_transform().transform_path(line.get_path())
    pts = path.vertices
    pts = pts[np.isfinite(pts).all(axis=1)]
    if not len(pts):
        return False
    pad = (
        line.get_markersize() / 2 * line.figure.dpi / 72 if line.get_marker() not in (None, "", "None") else 0
    )
    inside = (
        (pts[:, 0] >= box.x0 - pad)
        & (pts[:, 0] <= box.x1 + pad)
        & (pts[:, 1] >= box.y0 - pad)
        & (pts[:, 1] <= box.y1 + pad)
    )
    if inside.any():
        return True
    if line.get_linestyle() in ("None", "none", "", " "):
        return False
    return bool(path.intersects_bbox(box, filled=False))


def _collection_hits(coll, box: Bbox, renderer) -> bool:
    """Scatter points (offsets) or drawn shapes (paths) of a collection inside the box."""
    import numpy as np

    offsets = np.asarray(coll.get_offsets())
    if len(offsets) and coll.get_offset_transform() is not None and np.any(offsets):
        pts = coll.get_offset_transform().transform(offsets)
        pts = pts[np.isfinite(pts).all(axis=1)]
        return bool(
            (
                (pts[:, 0] >= box.x0) & (pts[:, 0] <= box.x1) & (pts[:, 1] >= box.y0) & (pts[:, 1] <= box.y1)
            ).any()
        )
    transform = coll.get_transform()
    for path in coll.get_paths():
        shape = transform.transform_path(path)
        if len(shape.vertices) and overlaps(shape.get_extents(), box):
            return True
    return False


def _data_over(legend_box: Bbox, ax: Axes, renderer) -> list[str]:
    """Names of the data artists of `ax` that the legend box covers (not spines, grid or background)."""
    hit = []
    for i, line in enumerate(ax.get_lines()):
        if line.get_visible() and _line_hits(line, legend_box):
            hit.append(_artist_name(line, i))
    covered_patches = [
        p for p in ax.patches if p.get_visible() and overlaps(p.get_window_extent(renderer), legend_box)
    ]
    if covered_patches:
        hit.append(f"{len(covered_patches)} patch(es) (bars/boxes)")
    for i, coll in enumerate(ax.collections):
        if coll.get_visible() and _collection_hits(coll, legend_box, renderer):
            hit.append(_artist_name(coll, i))
    return hit


def _legend_problems(fig: Figure, names: dict, renderer) -> list[str]:
    found = []
    placed = [(leg, [ax]) for ax in fig.axes if (leg := ax.get_legend()) is not None]
    placed += [(leg, list(fig.axes)) for leg in fig.legends]
    for leg, axes in placed:
        if not leg.get_visible():
            continue
        box = leg.get_window_extent(renderer)
        for ax in axes:
            if not ax.get_visible():
                continue
            hit = _data_over(box, ax, renderer)
            if hit:
                found.append(
                    f"{names[ax]}: the legend covers data ({', '.join(hit)}); "
                    'move it outside (bbox_to_anchor) or let matplotlib choose (loc="best")'
                )
    return found


def _text_problems(ax: Axes, name: str, renderer) -> list[str]:
    texts = [t for t in ax.texts if _shown(t)]
    boxes = [t.get_window_extent(renderer) for t in texts]
    clashes = [
        (texts[i].get_text(), texts[j].get_text())
        for i in range(len(boxes))
        for j in range(i + 1, len(boxes))
        if overlaps(boxes[i], boxes[j])
    ]
    if not clashes:
        return []
    shown = ", ".join(f"{a!r}/{b!r}" for a, b in clashes[:4])
    more = f" and {len(clashes) - 4} more" if len(clashes) > 4 else ""
    return [f"{name}: {len(clashes)} pair(s) of texts overlap ({shown}{more})"]


def _frame_text_problems(fig: Figure, axes: list, names: dict, renderer, cropped: bool) -> list[str]:
    """Titles, axis labels, the suptitle, figure texts and legends printed over each other or off the page."""
    owned = [(t, "the figure") for t in fig.texts if _shown(t)]  # the suptitle is one of them
    for ax in axes:
        texts = [ax.title, ax._left_title, ax._right_title]
        if ax.axison:
            texts += [ax.xaxis.label, ax.yaxis.label]
        owned += [(t, names[ax]) for t in texts if _shown(t)]
    legends = [(leg, names[ax]) for ax in axes if (leg := ax.get_legend()) is not None]
    owned += [(leg, "the figure") for leg in fig.legends]
    owned += [(leg, owner) for leg, owner in legends if leg.get_visible()]
    boxes = [t.get_window_extent(renderer) for t, _ in owned]
    found = []
    for i in range(len(owned)):
        for j in range(i + 1, len(owned)):
            if overlaps(boxes[i], boxes[j]):
                (a, owner_a), (b, owner_b) = owned[i], owned[j]
                found.append(
                    f"{owner_a} and {owner_b}: {_what(a)} and {_what(b)} overlap; "
                    "shorten one, make the figure larger or call tight_layout"
                )
    page = fig.bbox
    for (t, owner), box in zip(owned, boxes) if not cropped else ():
        if (
            box.x0 < page.x0 - TOUCH_PX
            or box.x1 > page.x1 + TOUCH_PX
            or box.y0 < page.y0 - TOUCH_PX
            or (box.y1 > page.y1 + TOUCH_PX)
        ):
            found.append(f"{owner}: {_what(t)} runs off the figure's edge (it is cut off)")
    return found


def _what(artist) -> str:
    """A text by its words, a legend by its entries."""
    if hasattr(artist, "get_texts"):
        entries = [t.get_text() for t in artist.get_texts()]
        return f"the legend ({', '.join(entries[:3])}{', ...' if len(entries) > 3 else ''})"
    return repr(artist.get_text())


def _has_content(ax: Axes) -> bool:
    return any(
        a.get_visible() for a in [*ax.get_lines(), *ax.patches, *ax.collections, *ax.images, *ax.texts]
    )


def problems(fig: Figure, *, cropped: bool = False) -> list[str]:
    """What makes `fig` hard to read, one sentence each; [] when nothing was found.

    Checks, per Axes: (a) tick labels of one axis that overlap each other, (b) a legend (the
    Axes' own, or a figure legend) whose box covers the Axes' lines, markers, bars, patches or
    collections, (c) texts and annotations drawn in the Axes that overlap each other; and across
    the figure (d) titles, axis labels, the suptitle, figure texts and legends that overlap each
    other or run off the figure's edge. A figure
    with no Axes, or whose Axes hold nothing, is a problem too: an empty picture never passes.

    `cropped=True` is for a figure only ever shown cropped to what it draws (the notebook's
    inline display saves with bbox_inches="tight"): a legend beside the plot is not cut off there.
    """
    renderer = _renderer(fig)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    if not axes:
        return ["the figure has no visible axes: nothing was drawn"]
    names = {ax: _axes_name(ax, i) for i, ax in enumerate(fig.axes)}
    if not any(_has_content(ax) for ax in axes):
        return [f"the figure's axes ({', '.join(names[ax] for ax in axes)}) hold no data and no text"]
    found = []
    for ax in axes:
        found += _tick_problems(ax, names[ax], renderer)
    found += _legend_problems(fig, names, renderer)
    for ax in axes:
        found += _text_problems(ax, names[ax], renderer)
    found += _frame_text_problems(fig, axes, names, renderer, cropped)
    return found
