"""Reading the text in an image: CRAFT finds the words, the CRNN reads each line.

The steps and their constants are EasyOCR's `readtext` for English with its default
arguments, written over NumPy (no OpenCV):

1. detection (craft.py): region and affinity score maps at half resolution;
2. `detection_boxes`: threshold the maps, label 4-connected components, drop the small
   and faint ones, dilate each word's segmentation and fit a minimum-area rectangle;
3. `group_boxes`: near-horizontal boxes are merged into lines (similar height, similar
   vertical centre, small horizontal gap), tilted ones are kept as free quadrilaterals;
4. `line_input`: each line is cropped from the grey image (a tilted one is warped
   upright), resized to height 64 keeping its aspect and padded;
5. `ctc_greedy`: best class per step, repeats collapsed, blanks dropped; the confidence
   is EasyOCR's: the product of the kept steps' probabilities to the 2/sqrt(n).
   A line read with confidence below 0.1 is read again from a contrast-stretched crop.

The result is in reading order: lines top to bottom, boxes in a line left to right.
"""
from __future__ import annotations

import functools
import math
import os

import numpy as np

__all__ = ["read_text", "OCR", "load_image", "detection_boxes", "connected_components",
           "min_area_rect", "group_boxes", "reading_order", "line_input", "ctc_greedy",
           "softmax", "grey", "MAX_PIXELS"]

MAX_PIXELS = 100_000_000        # larger images are refused (a decompression bomb, or a mistake)

# EasyOCR readtext defaults
TEXT_THRESHOLD, LOW_TEXT, LINK_THRESHOLD = 0.7, 0.4, 0.4
CANVAS_SIZE, MAG_RATIO = 2560, 1.0
SLOPE_THS, YCENTER_THS, HEIGHT_THS, WIDTH_THS, ADD_MARGIN = 0.1, 0.5, 0.5, 0.5, 0.1
MIN_SIZE = 20                   # boxes whose longer side is at most this are dropped
MIN_COMPONENT = 10              # components of fewer score-map pixels are noise
CONTRAST_THS, ADJUST_CONTRAST = 0.1, 0.5


# ---------------------------------------------------------------------------- images

def load_image(source, name: str = "image") -> np.ndarray:
    """A path, bytes, a PIL image or an array -> (H, W, 3) uint8 RGB. Refuses, naming
    `name`: a missing file, data that is not an image, a truncated one, an empty one, one
    of more than MAX_PIXELS pixels."""
    if isinstance(source, np.ndarray):
        return _rgb_array(source, name)
    Image = _pil()
    if isinstance(source, Image.Image):
        return _check_size(np.asarray(source.convert("RGB")), name)
    if isinstance(source, (bytes, bytearray)):
        import io
        fp, label = io.BytesIO(source), name
    elif isinstance(source, (str, os.PathLike)):
        fp, label = os.fspath(source), f"{name} {os.fspath(source)!r}"
        if not os.path.exists(fp):
            raise FileNotFoundError(f"{label}: no such file")
        if not os.path.isfile(fp):
            raise ValueError(f"{label}: not a regular file")
    else:
        raise TypeError(f"{name} must be a path, bytes, a PIL image or a NumPy array, got "
                        f"{type(source).__name__}")
    import warnings
    try:
        with warnings.catch_warnings():
            # the pixel limit below is ours; PIL's own warning would only repeat it
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(fp) as im:
                w, h = im.size
                if w * h > MAX_PIXELS:
                    raise ValueError(f"{label}: {w}x{h} is {w * h / 1e6:.0f} Mpixel, more than "
                                     f"the {MAX_PIXELS / 1e6:.0f} Mpixel this reads")
                if w == 0 or h == 0:
                    raise ValueError(f"{label}: the image is empty ({w}x{h})")
                im.load()
                rgb = im.convert("RGB")
    except Image.DecompressionBombError as e:
        raise ValueError(f"{label}: refused as too large ({e})") from None
    except Image.UnidentifiedImageError:
        raise ValueError(f"{label}: not an image that Pillow can read (PNG, JPEG, ...)") from None
    except (OSError, SyntaxError, EOFError) as e:
        if isinstance(e, FileNotFoundError | PermissionError | IsADirectoryError):
            raise
        raise ValueError(f"{label}: truncated or corrupt image data ({e})") from None
    return _check_size(np.asarray(rgb), label)


def _pil():
    try:
        from PIL import Image
    except ImportError:
        raise ImportError("reading images needs Pillow: pip install 'nbxtensor[ocr]' (or "
                          "pip install pillow)") from None
    return Image


def _check_size(a: np.ndarray, label: str) -> np.ndarray:
    h, w = a.shape[:2]
    if h == 0 or w == 0:
        raise ValueError(f"{label}: the image is empty ({w}x{h})")
    if h * w > MAX_PIXELS:
        raise ValueError(f"{label}: {w}x{h} is more than {MAX_PIXELS / 1e6:.0f} Mpixel")
    return a


def _rgb_array(a: np.ndarray, name: str) -> np.ndarray:
    if a.dtype != np.uint8:
        raise TypeError(f"{name}: an image array must be uint8, got {a.dtype}")
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[..., 0]
    if a.ndim == 2:
        a = np.repeat(a[..., None], 3, axis=2)
    elif not (a.ndim == 3 and a.shape[2] in (3, 4)):
        raise ValueError(f"{name}: an image array must be (H, W), (H, W, 1), (H, W, 3) RGB or "
                         f"(H, W, 4) RGBA, got shape {a.shape}")
    return _check_size(np.ascontiguousarray(a[..., :3]), name)


def grey(rgb: np.ndarray) -> np.ndarray:
    """ITU-R 601-2 luma (Pillow's "L" conversion, as OpenCV's to within rounding)."""
    return np.asarray(_pil().fromarray(rgb).convert("L"))


# ---------------------------------------------------------------------------- detection

def connected_components(mask: np.ndarray):
    """4-connected components of a boolean (H, W) mask by union-find over horizontal runs.
    -> (labels int32 (H, W): 0 background, 1..n in raster order of each component's first
    pixel; n; areas (n+1,); boxes (n+1, 4) as x, y, width, height)."""
    mask = np.asarray(mask, bool)
    H, W = mask.shape
    edges = np.diff(np.pad(mask, ((0, 0), (1, 1))).astype(np.int8), axis=1)
    rows, starts = np.nonzero(edges == 1)
    ends = np.nonzero(edges == -1)[1]              # exclusive; same order as the starts
    n_runs = len(rows)
    parent = np.arange(n_runs)

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first = np.searchsorted(rows, np.arange(H + 1))       # runs of row r: first[r]:first[r+1]
    for r in range(1, H):
        a0, a1, b1 = first[r - 1], first[r], first[r + 1]
        if a0 == a1 or a1 == b1:
            continue
        # runs of the row above overlapping run j: those ending after its start and
        # starting before its end (a contiguous range, the runs being sorted and disjoint)
        lo = np.searchsorted(ends[a0:a1], starts[a1:b1], "right")
        hi = np.searchsorted(starts[a0:a1], ends[a1:b1], "left")
        for j in range(b1 - a1):
            for i in range(lo[j], hi[j]):
                ra, rb = find(a0 + i), find(a1 + j)
                if ra != rb:
                    parent[max(ra, rb)] = min(ra, rb)     # the root stays the earliest run
    roots = np.array([find(i) for i in range(n_runs)], dtype=np.int64)
    uniq, run_label = np.unique(roots, return_inverse=True)   # roots ascend = raster order
    run_label = run_label + 1
    n = len(uniq)
    labels = np.zeros((H, W), np.int32)
    for r, s, e, k in zip(rows, starts, ends, run_label):
        labels[r, s:e] = k
    areas = np.bincount(run_label, weights=ends - starts, minlength=n + 1).astype(np.int64)
    x0 = np.full(n + 1, W, np.int64)
    y0 = np.full(n + 1, H, np.int64)
    x1 = np.zeros(n + 1, np.int64)
    y1 = np.zeros(n + 1, np.int64)
    np.minimum.at(x0, run_label, starts)
    np.minimum.at(y0, run_label, rows)
    np.maximum.at(x1, run_label, ends)
    np.maximum.at(y1, run_label, rows + 1)
    boxes = np.stack([x0, y0, x1 - x0, y1 - y0], 1)
    boxes[0] = 0
    areas[0] = H * W - areas[1:].sum()
    return labels, n, areas, boxes


def _convex_hull(points: np.ndarray) -> np.ndarray:
    """Andrew's monotone chain; (k, 2) hull vertices, counter-clockwise (y up)."""
    pts = np.unique(points.astype(np.float64), axis=0)       # sorted by x, then y
    if len(pts) <= 2:
        return pts

    def half(seq):
        out = []
        for p in seq:
            while len(out) >= 2 and ((out[-1][0] - out[-2][0]) * (p[1] - out[-2][1]) -
                                     (out[-1][1] - out[-2][1]) * (p[0] - out[-2][0])) <= 0:
                out.pop()
            out.append(p)
        return out
    lower, upper = half(pts), half(pts[::-1])
    return np.array(lower[:-1] + upper[:-1])


def min_area_rect(points: np.ndarray) -> np.ndarray:
    """The smallest-area rectangle holding the points (rotating calipers: one of its sides
    lies on an edge of the convex hull) -> its (4, 2) corners, clockwise on screen (x
    right, y down). A set of one point or of collinear points gives a degenerate one."""
    hull = _convex_hull(np.asarray(points).reshape(-1, 2))
    if len(hull) == 1:
        return np.repeat(hull, 4, axis=0)
    edges = np.roll(hull, -1, axis=0) - hull
    lengths = np.hypot(edges[:, 0], edges[:, 1])
    keep = lengths > 0
    u = edges[keep] / lengths[keep, None]                    # (e, 2) unit edge directions
    v = np.stack([-u[:, 1], u[:, 0]], 1)
    pu, pv = hull @ u.T, hull @ v.T                          # (k, e) projections
    area = (pu.max(0) - pu.min(0)) * (pv.max(0) - pv.min(0))
    i = int(np.argmin(area))
    a0, a1, b0, b1 = pu[:, i].min(), pu[:, i].max(), pv[:, i].min(), pv[:, i].max()
    corners = np.array([a0 * u[i] + b0 * v[i], a1 * u[i] + b0 * v[i],
                        a1 * u[i] + b1 * v[i], a0 * u[i] + b1 * v[i]])
    return _clockwise(corners)


def _clockwise(quad: np.ndarray) -> np.ndarray:
    """The quadrilateral's corners clockwise on screen, starting at the one with the
    smallest x + y (EasyOCR's order: top-left, top-right, bottom-right, bottom-left)."""
    x, y = quad[:, 0], quad[:, 1]
    if np.sum(x * np.roll(y, -1) - np.roll(x, -1) * y) < 0:
        quad = quad[::-1]
    return np.roll(quad, -int(np.argmin(quad.sum(1))), axis=0)


def _dilate(mask: np.ndarray, k: int) -> np.ndarray:
    """Binary dilation by a k x k square anchored at k // 2 (OpenCV's), outside = 0."""
    if k <= 1:
        return mask
    a = k // 2
    out = mask
    for axis in (0, 1):
        n = out.shape[axis]
        p = np.pad(out, [(a, k - 1 - a) if ax == axis else (0, 0) for ax in (0, 1)])
        acc = np.zeros_like(out)
        for d in range(k):
            acc |= np.take(p, np.arange(d, d + n), axis=axis)
        out = acc
    return out


def detection_boxes(region, affinity, text_threshold=TEXT_THRESHOLD,
                    link_threshold=LINK_THRESHOLD, low_text=LOW_TEXT):
    """Score maps -> word boxes in score-map coordinates (CRAFT's getDetBoxes): a list of
    (4, 2) float arrays, clockwise from the top-left, in component order."""
    region, affinity = np.asarray(region), np.asarray(affinity)
    text = region > low_text
    link = affinity > link_threshold
    labels, n, areas, stats = connected_components(text | link)
    H, W = region.shape
    boxes = []
    for k in range(1, n + 1):
        size = int(areas[k])
        if size < MIN_COMPONENT:
            continue
        x, y, w, h = (int(v) for v in stats[k])
        if region[y:y + h, x:x + w][labels[y:y + h, x:x + w] == k].max() < text_threshold:
            continue
        niter = int(math.sqrt(size * min(w, h) / (w * h)) * 2)
        sx, sy = max(x - niter, 0), max(y - niter, 0)
        ex, ey = min(x + w + niter + 1, W), min(y + h + niter + 1, H)
        win = (slice(sy, ey), slice(sx, ex))
        seg = (labels[win] == k) & ~(link[win] & ~text[win])   # the links themselves go
        seg = _dilate(seg, 1 + niter)
        ys, xs = np.nonzero(seg)
        if len(xs) == 0:
            continue
        pts = np.stack([xs + sx, ys + sy], 1)
        box = min_area_rect(pts)
        bw, bh = np.linalg.norm(box[0] - box[1]), np.linalg.norm(box[1] - box[2])
        if abs(1 - max(bw, bh) / (min(bw, bh) + 1e-5)) <= 0.1:   # near-square: axis-aligned
            l, r, t, b = pts[:, 0].min(), pts[:, 0].max(), pts[:, 1].min(), pts[:, 1].max()
            box = np.array([[l, t], [r, t], [r, b], [l, b]], np.float64)
        boxes.append(box.astype(np.float32))
    return boxes


# ---------------------------------------------------------------------------- grouping

def group_boxes(quads, slope_ths=SLOPE_THS, ycenter_ths=YCENTER_THS, height_ths=HEIGHT_THS,
                width_ths=WIDTH_THS, add_margin=ADD_MARGIN):
    """Word quadrilaterals (integer corners, clockwise from the top-left) -> (lines, free):
    lines are [x_min, x_max, y_min, y_max] of merged near-horizontal words with a margin,
    free the tilted words as quadrilaterals grown by a margin (EasyOCR's group_text_box)."""
    horizontal, free = [], []
    for q in quads:
        p = np.asarray(q, np.float64).reshape(-1)
        slope_up = (p[3] - p[1]) / max(10, p[2] - p[0])
        slope_down = (p[5] - p[7]) / max(10, p[4] - p[6])
        if max(abs(slope_up), abs(slope_down)) < slope_ths:
            xs, ys = p[0::2], p[1::2]
            horizontal.append([xs.min(), xs.max(), ys.min(), ys.max(),
                               0.5 * (ys.min() + ys.max()), ys.max() - ys.min()])
        else:
            free.append(_grow_quad(p, add_margin))
    merged = []
    for line in _lines(sorted(horizontal, key=lambda b: b[4]), ycenter_ths):
        for group in _runs_in_line(sorted(line, key=lambda b: b[0]), height_ths, width_ths):
            x0, x1 = min(b[0] for b in group), max(b[1] for b in group)
            y0, y1 = min(b[2] for b in group), max(b[3] for b in group)
            m = int(add_margin * min(x1 - x0, y1 - y0))
            merged.append([int(x0) - m, int(x1) + m, int(y0) - m, int(y1) + m])
    return merged, free


def _lines(boxes, ycenter_ths):
    """Boxes sorted by vertical centre -> lists of boxes whose centres stay within
    ycenter_ths of the line's mean height from the line's mean centre."""
    lines, cur = [], []
    for b in boxes:
        if cur and abs(np.mean([c[4] for c in cur]) - b[4]) >= \
                ycenter_ths * np.mean([c[5] for c in cur]):
            lines.append(cur)
            cur = []
        cur.append(b)
    if cur:
        lines.append(cur)
    return lines


def _runs_in_line(boxes, height_ths, width_ths):
    """Boxes of one line sorted by x -> groups of neighbours of similar height whose gap
    is below width_ths times the box's height."""
    groups, cur, x_max = [], [], None
    for b in boxes:
        if cur and abs(np.mean([c[5] for c in cur]) - b[5]) < height_ths * \
                np.mean([c[5] for c in cur]) and b[0] - x_max < width_ths * (b[3] - b[2]):
            cur.append(b)
        else:
            if cur:
                groups.append(cur)
            cur = [b]
        x_max = b[1]
    if cur:
        groups.append(cur)
    return groups


def _grow_quad(p, add_margin):
    height = np.hypot(p[6] - p[0], p[7] - p[1])
    width = np.hypot(p[2] - p[0], p[3] - p[1])
    m = int(1.44 * add_margin * min(width, height))
    t13 = abs(np.arctan((p[1] - p[5]) / max(10, p[0] - p[4])))
    t24 = abs(np.arctan((p[3] - p[7]) / max(10, p[2] - p[6])))
    c13, s13, c24, s24 = np.cos(t13) * m, np.sin(t13) * m, np.cos(t24) * m, np.sin(t24) * m
    return np.array([[p[0] - c13, p[1] - s13], [p[2] + c24, p[3] - s24],
                     [p[4] + c13, p[5] + s13], [p[6] - c24, p[7] + s24]])


def reading_order(quads, ycenter_ths=YCENTER_THS):
    """Indices of the quadrilaterals in reading order: lines (the same clustering of
    vertical centres as the grouping) top to bottom, each left to right."""
    items = []
    for i, q in enumerate(quads):
        q = np.asarray(q, np.float64)
        y0, y1 = q[:, 1].min(), q[:, 1].max()
        items.append([q[:, 0].min(), i, 0, 0, 0.5 * (y0 + y1), y1 - y0])
    order = []
    for line in _lines(sorted(items, key=lambda b: b[4]), ycenter_ths):
        order += [b[1] for b in sorted(line, key=lambda b: b[0])]
    return order


# ---------------------------------------------------------------------------- recognition

def _warp_quad(img: np.ndarray, quad: np.ndarray) -> np.ndarray:
    """The quadrilateral (tl, tr, br, bl) warped upright by the homography onto a rectangle
    of its longer opposite sides, bilinear, black outside (EasyOCR's four_point_transform)."""
    tl, tr, br, bl = quad.astype(np.float64)
    w = max(int(np.linalg.norm(br - bl)), int(np.linalg.norm(tr - tl)))
    h = max(int(np.linalg.norm(tr - br)), int(np.linalg.norm(tl - bl)))
    if w < 1 or h < 1:
        return np.zeros((0, 0), img.dtype)
    dst = np.array([[0, 0], [w - 1, 0], [w - 1, h - 1], [0, h - 1]], np.float64)
    a = []
    for (x, y), (u, v) in zip(dst, quad.astype(np.float64)):   # dst -> src homography
        a.append([x, y, 1, 0, 0, 0, -u * x, -u * y, u])
        a.append([0, 0, 0, x, y, 1, -v * x, -v * y, v])
    a = np.array(a)
    m = np.append(np.linalg.solve(a[:, :8], a[:, 8]), 1.0).reshape(3, 3)
    yy, xx = np.mgrid[0:h, 0:w]
    src = m @ np.stack([xx.ravel(), yy.ravel(), np.ones(w * h)])
    sx, sy = src[0] / src[2], src[1] / src[2]
    x0, y0 = np.floor(sx).astype(np.int64), np.floor(sy).astype(np.int64)
    fx, fy = sx - x0, sy - y0
    H, W = img.shape
    pad = np.pad(img.astype(np.float64), 1)

    def at(yi, xi):
        ok = (yi >= -1) & (yi <= H) & (xi >= -1) & (xi <= W)
        return np.where(ok, pad[np.clip(yi + 1, 0, H + 1), np.clip(xi + 1, 0, W + 1)], 0)
    out = (at(y0, x0) * (1 - fx) * (1 - fy) + at(y0, x0 + 1) * fx * (1 - fy) +
           at(y0 + 1, x0) * (1 - fx) * fy + at(y0 + 1, x0 + 1) * fx * fy)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8).reshape(h, w)


def _stretch_contrast(img: np.ndarray, target: float) -> np.ndarray:
    """EasyOCR's adjust_contrast_grey: stretch a low-contrast crop's 10-90% range."""
    high, low = np.percentile(img, 90), np.percentile(img, 10)
    if (high - low) / max(10, high + low) >= target:
        return img
    ratio = 200.0 / max(10, high - low)
    return np.clip((img.astype(np.int64) - low + 25) * ratio, 0, 255).astype(np.uint8)


def line_input(crop: np.ndarray, height: int, contrast: float = 0.0) -> np.ndarray:
    """A grey uint8 crop -> (1, 1, height, W) float32 in [-1, 1]: resized to `height`
    keeping its aspect (bicubic), padded on the right with its last column to a multiple
    of the height that holds the longer side's ratio (EasyOCR's AlignCollate)."""
    Image = _pil()
    h, w = crop.shape
    ratio = max(w / h, h / w)
    pad_w = math.ceil(ratio) * height
    new_w = max(1, min(math.ceil(height * w / h), pad_w))
    if contrast > 0:
        crop = _stretch_contrast(crop, contrast)
    img = np.asarray(Image.fromarray(crop, "L").resize((new_w, height), Image.BICUBIC),
                     np.float32)
    out = np.empty((1, 1, height, max(pad_w, 8)), np.float32)
    out[0, 0, :, :new_w] = img / 127.5 - 1.0
    out[0, 0, :, new_w:] = out[0, 0, :, new_w - 1:new_w]
    return out


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, np.float64)
    z = np.exp(z - z.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def ctc_greedy(probs: np.ndarray, charset: str) -> tuple[str, float]:
    """(T, classes) probabilities -> (text, confidence): the best class per step, repeats
    collapsed, blanks (class 0) dropped; confidence = prod(p)^(2/sqrt(n)) over the steps
    whose best class is not the blank (0 when there are none)."""
    probs = np.asarray(probs)
    if probs.ndim != 2 or probs.shape[1] != len(charset) + 1:
        raise ValueError(f"ctc_greedy: probs must be (T, {len(charset) + 1}), got shape "
                         f"{probs.shape}")
    best = probs.argmax(1)
    keep = (best != 0) & np.insert(best[1:] != best[:-1], 0, True)
    text = "".join(charset[i - 1] for i in best[keep])
    p = probs.max(1)[best != 0]
    conf = float(np.prod(p) ** (2.0 / math.sqrt(len(p)))) if len(p) else 0.0
    return text, conf


# ---------------------------------------------------------------------------- pipeline

def _graphed(module):
    """The module replayed from CUDA graphs, one per input shape (nbx.cuda.graphed)."""
    from ..cuda import graphed
    return graphed(module)


class OCR:
    """CRAFT + the english_g2 recogniser on one device and dtype."""

    def __init__(self, device=None, dtype=None, graphs: bool = False):
        from ..device import as_device
        from .. import dtypes as _dt
        from .craft import CRAFT
        from .crnn import CRNN, ENGLISH_G2_CHARACTERS
        from .registry import ocr_weights
        self.device = as_device(device if device is not None else "cpu")
        self.dtype = _dt.as_dtype(dtype if dtype is not None else "float32", "dtype")
        allowed = ("float32", "bfloat16", "float16") + (("float64",) if
                                                       self.device.type == "cpu" else ())
        if self.dtype.name not in allowed:
            raise TypeError(f"dtype must be float32, bfloat16 or float16 (float64 on cpu), got "
                            f"{self.dtype.name} on {self.device}")
        if graphs.__class__ is not bool:
            raise TypeError(f"OCR: graphs must be a bool, got {graphs!r}")
        if graphs and self.device.type != "cuda":
            raise ValueError(f"OCR: graphs=True needs a cuda device, got {self.device}")
        det, rec = ocr_weights()
        self.detector = CRAFT.from_file(det, self.device, self.dtype)
        self.recogniser = CRNN.from_file(rec, self.device, self.dtype)
        self.charset = ENGLISH_G2_CHARACTERS
        # graphs=True (cuda): both networks replay from CUDA graphs, one per input shape
        self._detect_net = _graphed(self.detector) if graphs else None
        self._recognise_net = _graphed(self.recogniser) if graphs else self.recogniser

    def detect(self, rgb):
        """(H, W, 3) uint8 -> (word quadrilaterals in image coordinates, region, affinity)."""
        boxes, region, affinity = self.detector.detect(
            rgb, canvas_size=CANVAS_SIZE, mag_ratio=MAG_RATIO, text_threshold=TEXT_THRESHOLD,
            low_text=LOW_TEXT, link_threshold=LINK_THRESHOLD, run=self._detect_net)
        return [b.astype(np.int32) for b in boxes], region, affinity

    def recognise(self, crop, contrast=0.0):
        """A grey uint8 crop -> (text, confidence)."""
        from ..creation import from_numpy
        from .crnn import HEIGHT
        x = from_numpy(line_input(crop, HEIGHT, contrast)).to(device=self.device,
                                                                dtype=self.dtype)
        logits = self._recognise_net(x)[0].float().numpy()
        return ctc_greedy(softmax(logits), self.charset)

    def read(self, image, timings=None):
        """image (see load_image) -> [(box, text, confidence)] in reading order. `timings`,
        a dict, receives the seconds spent detecting and recognising."""
        import time
        rgb = load_image(image)
        t0 = time.perf_counter()
        quads, _, _ = self.detect(rgb)
        lines, free = group_boxes([q.reshape(-1) for q in quads])
        t1 = time.perf_counter()
        g = grey(rgb)
        H, W = g.shape
        found = []
        for x0, x1, y0, y1 in lines:
            if max(x1 - x0, y1 - y0) <= MIN_SIZE:
                continue
            x0, x1, y0, y1 = max(0, x0), min(x1, W), max(0, y0), min(y1, H)
            if x1 - x0 < 1 or y1 - y0 < 1:
                continue
            found.append((np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]]),
                          g[y0:y1, x0:x1]))
        for q in free:
            if max(np.ptp(q[:, 0]), np.ptp(q[:, 1])) <= MIN_SIZE:
                continue
            crop = _warp_quad(g, q)
            if crop.size:
                found.append((q, crop))
        results = []
        for box, crop in found:
            text, conf = self.recognise(crop)
            if conf < CONTRAST_THS:         # a second look at a faint line
                text2, conf2 = self.recognise(crop, ADJUST_CONTRAST)
                if conf2 > conf:
                    text, conf = text2, conf2
            results.append((np.asarray(box).astype(np.int64).tolist(), text, conf))
        order = reading_order([np.asarray(b, np.float64) for b, _, _ in results])
        if timings is not None:
            timings["detect"] = t1 - t0
            timings["recognise"] = time.perf_counter() - t1
        return [results[i] for i in order]


@functools.lru_cache(maxsize=4)
def _reader(device, dtype):
    return OCR(device, dtype)


def read_text(image, device=None, dtype=None):
    """Read the text in `image` (a path, bytes, a PIL image or a uint8 array) ->
    [(box, text, confidence)] in reading order; box the line's four corners
    [[x, y], ...] clockwise from the top-left in image pixels. The models are loaded
    once per (device, dtype) and kept."""
    from ..device import as_device
    from .. import dtypes as _dt
    dev = as_device(device if device is not None else "cpu")
    dt = _dt.as_dtype(dtype if dtype is not None else "float32", "dtype")
    return _reader(str(dev), dt.name).read(image)
