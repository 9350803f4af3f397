"""Camera rendering for the sample fleet: a table-top cell built from real photographs.

All imagery comes from the photographs shipped inside scikit-image's wheel (read straight
from ``skimage/data``; nothing is downloaded): grey-level textures (gravel, grass, brick)
are mirror-tiled and tinted into table tops, walls, cloth and wood; colour photographs
(coffee, chelsea, astronaut, rocket, motorcycle, hubble, retina, ihc, ...) become posters,
clutter on the table and the printed faces of the boxes the robot handles.

Geometry is a real pinhole model: the table (z = 0), the wall behind the robot and the
side walls are textured planes, rendered once per episode and camera into an oversized
"canvas" by plane homographies (supersampled 2x, then box-filtered). Per frame a scene
camera (rigidly mounted: no motion of its own) crops its canvas, then draws the dynamic
parts -- soft shadows, decals, boxes, the arm and the gripper -- projected with the same
camera. The wrist camera moves with the flange, so its background is re-rendered per frame
from the table texture by a homography (strong pan / zoom as the arm moves).

Speed (``SimulatedEpisode.render_frame``, 640x480, pinned to one core of the 2-core dev
box, Python 3.11 / Pillow 13 / numpy 2.4, averaged over 150 frames each of 3 episodes):
scene cameras 7-8.5 ms per frame (background box-resize ~2 ms, shadows + arm + objects
~3-4 ms, lighting + noise ~1.8 ms), wrist camera 10-13 ms (its per-frame perspective warp
of the table is ~6 ms in Pillow, halved when the view is magnified >= 2x); about 9 ms
averaged over the three default cameras.
Per episode and camera the first frame costs ~0.1-0.3 s more (textures, canvases, noise
bank). JPEG encoding at quality 90 adds ~1 ms. Known simplifications: polygon edges of
the arm are not anti-aliased and there is no motion blur.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageChops, ImageDraw, ImageFilter

from .robot import ArmModel, WorldState, stable_hash

# --------------------------------------------------------------------------------------
# photographs
# --------------------------------------------------------------------------------------
COLOUR_PHOTOS = (
    "coffee",
    "chelsea",
    "astronaut",
    "rocket",
    "motorcycle_left",
    "hubble_deep_field",
    "retina",
    "ihc",
    "color",
    "motorcycle_right",
)
GREY_TEXTURES = ("gravel", "grass", "brick")
# (a str -> str table, alike in shape only to catalog/curation.py's _EXPECTED)
_FILES = {
    "coffee": "coffee.png",
    "chelsea": "chelsea.png",
    "astronaut": "astronaut.png",
    "rocket": "rocket.jpg",
    "motorcycle_left": "motorcycle_left.png",
    "motorcycle_right": "motorcycle_right.png",
    "hubble_deep_field": "hubble_deep_field.jpg",
    "retina": "retina.jpg",
    "ihc": "ihc.png",
    "color": "color.png",
    "gravel": "gravel.png",
    "grass": "grass.png",
    "brick": "brick.png",
    "text": "text.png",
    "page": "page.png",
    "camera": "camera.png",
    "coins": "coins.png",
}


def photo_dir() -> Path:
    import skimage  # only for its location; the files are read with Pillow

    return Path(skimage.__file__).parent / "data"


@functools.lru_cache(maxsize=None)
def load_photo(name: str) -> np.ndarray:
    """A photograph from scikit-image's wheel as uint8 (H, W, 3) or (H, W) for grey textures."""
    path = photo_dir() / _FILES[name]
    with Image.open(path) as photo:
        im = photo.convert("L" if name in GREY_TEXTURES or name in ("text", "page", "camera", "coins") else "RGB")
        a = np.asarray(im).copy()
    a.setflags(write=False)
    return a


def _resize(a: np.ndarray, w: int, h: int, resample=Image.Resampling.BILINEAR) -> np.ndarray:
    return np.asarray(Image.fromarray(a).resize((max(1, w), max(1, h)), resample))


def smooth_field(rng: np.random.Generator, h: int, w: int, cells: int = 6) -> np.ndarray:
    """Low-frequency noise in [-1, 1]-ish: a small random grid upsampled bicubically."""
    g = rng.normal(0.0, 1.0, size=(cells + 3, max(3, int(cells * w / max(h, 1)) + 3))).astype(np.float32)
    im = Image.fromarray(g, mode="F").resize((w + 2 * w // cells, h + 2 * h // cells), Image.Resampling.BICUBIC)
    a = np.asarray(im)
    oy, ox = h // cells, w // cells
    return a[oy : oy + h, ox : ox + w] / 1.5


def mirror_tile(
    gray: np.ndarray, h: int, w: int, scale: float, rng: np.random.Generator, aniso: float = 1.0
) -> np.ndarray:
    """Cover (h, w) with a grey texture scaled by ``scale`` (x ``aniso`` horizontally) and
    mirror-tiled (seamless); float32 normalised to zero mean, unit std."""
    th = max(8, int(round(gray.shape[0] * scale)))
    tw = max(8, int(round(gray.shape[1] * scale * aniso)))
    t = _resize(gray, tw, th, Image.Resampling.LANCZOS if scale < 1 else Image.Resampling.BICUBIC).astype(np.float32)
    if rng.random() < 0.5:
        t = t[:, ::-1]
    quad = np.concatenate([np.concatenate([t, t[:, ::-1]], 1), np.concatenate([t[::-1], t[::-1, ::-1]], 1)], 0)
    oy, ox = int(rng.integers(quad.shape[0])), int(rng.integers(quad.shape[1]))
    reps = (h + oy) // quad.shape[0] + 2, (w + ox) // quad.shape[1] + 2
    big = np.tile(quad, reps)[oy : oy + h, ox : ox + w]
    big = big - big.mean()
    return big / max(float(big.std()), 1e-3)


def tint(g: np.ndarray, colour, contrast: float, variation: np.ndarray | None = None) -> np.ndarray:
    """Grey field (zero mean, unit std) -> RGB uint8 around ``colour`` with the given contrast."""
    c = np.asarray(colour, dtype=np.float32)
    f = 1.0 + contrast * g
    if variation is not None:
        f = f * (1.0 + variation)
    out = c[None, None, :] * f[..., None]
    return np.clip(out, 0, 255).astype(np.uint8)


def photo_crop(rng: np.random.Generator, name: str, aspect: float, frac=(0.3, 0.8)) -> np.ndarray:
    """A random crop of a colour photograph with width/height = ``aspect``."""
    p = load_photo(name)
    H, W = p.shape[:2]
    ch = int(H * rng.uniform(*frac))
    cw = int(ch * aspect)
    if cw > W:
        cw = W
        ch = max(8, int(cw / aspect))
    y0, x0 = int(rng.integers(0, H - ch + 1)), int(rng.integers(0, W - cw + 1))
    return p[y0 : y0 + ch, x0 : x0 + cw]


# --------------------------------------------------------------------------------------
# cameras and homographies
# --------------------------------------------------------------------------------------
def look_at(eye, target, up=(0.0, 0.0, 1.0)) -> tuple[np.ndarray, np.ndarray]:
    """World->camera rotation and translation, OpenCV axes (x right, y down, z forward)."""
    eye, target, up = (np.asarray(v, dtype=np.float64) for v in (eye, target, up))
    f = target - eye
    f /= np.linalg.norm(f)
    r = np.cross(f, up)
    r /= np.linalg.norm(r)
    d = np.cross(f, r)
    R = np.stack([r, d, f])
    return R, -R @ eye


def intrinsics(width: int, height: int, hfov_deg: float) -> np.ndarray:
    f = (width / 2) / math.tan(math.radians(hfov_deg) / 2)
    return np.array([[f, 0, width / 2], [0, f, height / 2], [0, 0, 1.0]])


@dataclass
class Camera:
    K: np.ndarray
    R: np.ndarray  # world -> camera
    t: np.ndarray

    @property
    def centre(self) -> np.ndarray:
        return -self.R.T @ self.t

    def to_cam(self, P: np.ndarray) -> np.ndarray:
        return P @ self.R.T + self.t

    def project(self, P: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        Pc = self.to_cam(np.asarray(P, dtype=np.float64))
        z = Pc[..., 2]
        zs = np.where(np.abs(z) < 1e-9, 1e-9, z)
        u = self.K[0, 0] * Pc[..., 0] / zs + self.K[0, 2]
        v = self.K[1, 1] * Pc[..., 1] / zs + self.K[1, 2]
        return np.stack([u, v], axis=-1), z

    def plane_homography(self, O, U, V) -> np.ndarray:
        """3x3 H: texture pixel (u, v, 1) -> image pixel, for the plane P = O + u U + v V."""
        return self.K @ np.stack([self.R @ U, self.R @ V, self.R @ O + self.t], axis=1)


def pil_coeffs(H_img_from_src: np.ndarray, offset=(0.0, 0.0), out_scale: float = 1.0) -> tuple:
    """PIL PERSPECTIVE coefficients (output pixel -> source pixel) for an image-from-source
    homography; the output image starts at ``offset`` and has ``out_scale`` pixels per image pixel."""
    S = np.array([[1 / out_scale, 0, offset[0]], [0, 1 / out_scale, offset[1]], [0, 0, 1.0]])
    Hi = np.linalg.inv(H_img_from_src) @ S
    Hi = Hi / Hi[2, 2]
    return tuple(Hi.flatten()[:8])


def homography_from_points(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """3x3 H with dst ~ H src for 4 point pairs."""
    A = np.zeros((8, 8))
    b = np.zeros(8)
    for i in range(4):
        x, y = src[i]
        u, v = dst[i]
        A[2 * i] = [x, y, 1, 0, 0, 0, -u * x, -u * y]
        A[2 * i + 1] = [0, 0, 0, x, y, 1, -v * x, -v * y]
        b[2 * i], b[2 * i + 1] = u, v
    h = np.linalg.solve(A, b)
    return np.append(h, 1.0).reshape(3, 3)


# --------------------------------------------------------------------------------------
# the static world
# --------------------------------------------------------------------------------------
TABLE_X = (-0.45, 1.0)
TABLE_Y = (-1.25, 1.25)
WALL_X = -0.45
SIDE_Y = 2.2
FLOOR_Z = -0.76
LIGHT = np.array([0.35, 0.25, 1.0]) / np.linalg.norm([0.35, 0.25, 1.0])  # towards the key light

# site style: (table colour, table texture, contrast, aniso), (wall colour, texture, contrast)
_TABLES = [
    ((196, 188, 172), "gravel", 0.07, 1.0),  # light laminate
    ((150, 104, 66), "grass", 0.16, 7.0),  # wood (grass stretched into grain)
    ((74, 86, 84), "grass", 0.2, 1.0),  # dark cutting mat
    ((170, 172, 170), "gravel", 0.12, 1.0),  # grey stone-like bench
    ((186, 150, 110), "gravel", 0.1, 5.0),  # birch ply
]
_WALLS = [
    ((160, 92, 70), "brick", 0.22),
    ((214, 212, 204), "gravel", 0.035),
    ((150, 160, 170), "brick", 0.12),
    ((200, 190, 160), "gravel", 0.05),
]


@dataclass
class Textured:
    """A texture with its brightness variants cached (per-face shading without per-pixel work)."""

    image: Image.Image  # RGBA
    _cache: dict = field(default_factory=dict)

    def shaded(self, level: float) -> Image.Image:
        k = int(round(min(max(level, 0.3), 1.3) * 20))
        im = self._cache.get(k)
        if im is None:
            f = k / 20
            lut = [min(255, int(v * f + 0.5)) for v in range(256)] * 3 + list(range(256))
            im = self.image.point(lut)
            self._cache[k] = im
        return im


@dataclass
class BoxLook:
    faces: dict[str, Textured]  # "+z", "+x", "-x", "+y", "-y"
    colour: tuple[int, int, int]


class World:
    """Static, per-episode appearance: planes' textures, object looks, layout of clutter."""

    def __init__(self, seed: int, site: str, robot_id: str, script, width: int):
        self.seed = seed
        self.script = script
        rng = np.random.default_rng([seed, 301])
        srng = np.random.default_rng(stable_hash("site", site))
        self.scale = float(np.clip(width / 640.0, 0.3, 2.0))
        self.table_ppm = 900.0 * self.scale  # table texture pixels per metre
        self.wall_ppm = 330.0 * self.scale
        tcol, tname, tcon, taniso = _TABLES[int(srng.integers(len(_TABLES)))]
        wcol, wname, wcon = _WALLS[int(srng.integers(len(_WALLS)))]
        table_colour = np.array(tcol) * rng.uniform(0.96, 1.04, 3)
        self.table = self._table_texture(rng, table_colour, tname, tcon, taniso)
        self.wall = self._wall_texture(rng, srng, wcol, wname, wcon)
        fl = (0.55 * np.array(table_colour)).astype(int)
        self.floor_colour = tuple(int(v) for v in fl)
        self.boxes: dict[str, BoxLook] = {}
        for obj in script.objects:
            self.boxes[obj.name] = self._box_look(rng, obj.kind, obj.size)
        self.towel_tex: Textured | None = None
        self.towel_back: Textured | None = None
        if script.towel is not None:
            self._towel(rng)
        self.stain_tex = None
        if script.stain is not None:
            self._stain(rng)
        self.cabinet_looks: dict[str, Textured] | None = None
        if script.cabinet is not None:
            self._cabinet(rng)
        self.table_img = Image.fromarray(self.table)
        self.wall_img = Image.fromarray(self.wall)
        del self.table, self.wall  # the PIL copies are what rendering uses

    # -- plane textures -------------------------------------------------------------
    def _table_texture(self, rng, colour, name, contrast, aniso) -> np.ndarray:
        ppm = self.table_ppm
        h = int((TABLE_X[1] - TABLE_X[0]) * ppm)  # rows along +x
        w = int((TABLE_Y[1] - TABLE_Y[0]) * ppm)  # columns along +y
        g = mirror_tile(load_photo(name), h, w, 0.45 * self.scale, rng, aniso)
        g2 = mirror_tile(load_photo("gravel"), h, w, 0.3 * self.scale, rng)  # fine grain, dust
        var = 0.06 * smooth_field(rng, h, w, 5) + 0.03 * smooth_field(rng, h, w, 17)
        tex = tint(g + 0.35 * g2, colour, contrast, var)
        self._bake_clutter(rng, tex)
        return tex

    def table_px(self, x: float, y: float) -> tuple[float, float]:
        """(column, row) in the table texture of world point (x, y)."""
        return (y - TABLE_Y[0]) * self.table_ppm, (x - TABLE_X[0]) * self.table_ppm

    def table_plane(self):
        s = 1.0 / self.table_ppm
        return np.array([TABLE_X[0], TABLE_Y[0], 0.0]), np.array([0.0, s, 0.0]), np.array([s, 0.0, 0.0])

    def _paste(
        self,
        tex: np.ndarray,
        img: np.ndarray,
        x: float,
        y: float,
        angle_deg: float,
        alpha: np.ndarray | None = None,
        shadow: float = 0.0,
    ) -> None:
        """Paste ``img`` (its size in table pixels) centred at world (x, y), rotated, with an
        optional soft drop shadow (``shadow`` = darkening under it, 0..1)."""
        a = alpha if alpha is not None else np.full(img.shape[:2], 255, np.uint8)
        pad = int(0.03 * self.table_ppm) if shadow > 0 else 0
        if pad:
            img = np.pad(img, ((pad, pad), (pad, pad), (0, 0)))
            a = np.pad(a, pad)
        pil = Image.fromarray(img).rotate(angle_deg, Image.Resampling.BILINEAR, expand=True)
        al = Image.fromarray(a).rotate(angle_deg, Image.Resampling.BILINEAR, expand=True)
        cx, cy = self.table_px(x, y)
        x0, y0 = int(cx - pil.width / 2), int(cy - pil.height / 2)
        h, w = tex.shape[:2]
        xa, ya, xb, yb = max(0, x0), max(0, y0), min(w, x0 + pil.width), min(h, y0 + pil.height)
        if xa >= xb or ya >= yb:
            return
        win = (slice(ya - y0, yb - y0), slice(xa - x0, xb - x0))
        dst = tex[ya:yb, xa:xb].astype(np.float32)
        if pad:
            # light from above, slightly from +x / +y: the shadow falls towards -x / -y (up, left here)
            shifted = al.transform(
                al.size, Image.Transform.AFFINE, (1, 0, pad * 0.35, 0, 1, pad * 0.5), Image.Resampling.BILINEAR
            )
            sh = np.asarray(shifted.filter(ImageFilter.GaussianBlur(pad * 0.3)))[win].astype(np.float32) / 255.0
            dst *= 1.0 - shadow * sh[..., None]
        src = np.asarray(pil)[win].astype(np.float32)
        k = np.asarray(al)[win][..., None].astype(np.float32) / 255.0
        tex[ya:yb, xa:xb] = np.clip(dst * (1 - k) + src * k, 0, 255).astype(np.uint8)

    def _bake_clutter(self, rng, tex) -> None:
        ppm = self.table_ppm
        spots = [
            (0.82, 0.55),
            (0.85, -0.6),
            (-0.25, 0.62),
            (-0.28, -0.55),
            (0.95, 0.05),
            (0.7, 0.85),
            (0.75, -0.9),
            (-0.1, 0.95),
        ]
        order = rng.permutation(len(spots))
        n = int(rng.integers(4, 7))
        for k in order[:n]:
            x, y = spots[k]
            x += rng.uniform(-0.05, 0.05)
            y += rng.uniform(-0.05, 0.05)
            kind = rng.choice(["cup", "page", "photo", "mag"])
            if kind == "cup":  # the espresso cup from coffee.png, cut out along the saucer
                p = load_photo("coffee")[10:390, 30:450]
                s = 0.17 * ppm
                img = _resize(p, int(s * p.shape[1] / p.shape[0]), int(s))
                yy, xx = np.mgrid[: img.shape[0], : img.shape[1]]
                cy0, cx0, ry, rx = img.shape[0] * 0.53, img.shape[1] * 0.5, img.shape[0] * 0.47, img.shape[1] * 0.47
                d = ((yy - cy0) / ry) ** 2 + ((xx - cx0) / rx) ** 2
                alpha = (np.clip((1.0 - d) * 12, 0, 1) * 255).astype(np.uint8)
                self._paste(tex, img, x, y, rng.uniform(0, 360), alpha, shadow=0.45)
            elif kind == "page":  # a printed page (text.png / page.png)
                g = load_photo(str(rng.choice(["text", "page"])))
                w_m = rng.uniform(0.2, 0.26)
                img = _resize(g, int(w_m * ppm), int(w_m * ppm * 1.41))
                paper = np.array([238, 236, 228]) * rng.uniform(0.95, 1.0)
                ink = img.astype(np.float32) / 255.0
                rgb = np.clip(paper[None, None] * (0.25 + 0.75 * ink[..., None]), 0, 255).astype(np.uint8)
                self._paste(tex, rgb, x, y, rng.uniform(-40, 40), shadow=0.12)
            else:  # a photo print or a magazine
                name = str(rng.choice(COLOUR_PHOTOS))
                crop = photo_crop(rng, name, rng.uniform(0.7, 1.5))
                w_m = rng.uniform(0.12, 0.2) if kind == "photo" else rng.uniform(0.2, 0.28)
                img = _resize(crop, int(w_m * ppm), int(w_m * ppm * crop.shape[0] / crop.shape[1]))
                if kind == "photo":  # white border
                    b = max(2, int(0.008 * ppm))
                    img = np.pad(img, ((b, b), (b, b), (0, 0)), constant_values=235)
                self._paste(tex, img, x, y, rng.uniform(0, 360), shadow=0.15)

    def _wall_texture(self, rng, srng, colour, name, contrast) -> np.ndarray:
        ppm = self.wall_ppm
        self.wall_y = (-3.0, 3.0)
        self.wall_z = (FLOOR_Z, 2.1)
        h = int((self.wall_z[1] - self.wall_z[0]) * ppm)  # rows downwards from the top
        w = int((self.wall_y[1] - self.wall_y[0]) * ppm)  # columns towards -y (seen from the robot's front)
        src = np.ascontiguousarray(load_photo(name).T) if name == "brick" else load_photo(name)  # courses horizontal
        g = mirror_tile(src, h, w, 0.55 * self.scale if name == "brick" else 0.5 * self.scale, rng)
        var = 0.08 * smooth_field(rng, h, w, 4)
        wall = tint(g, colour, contrast, var)
        # posters (fixed per site, with a little per-episode variation), framed
        n = int(srng.integers(2, 4))
        names = srng.choice(COLOUR_PHOTOS, size=n, replace=False)
        ys = np.linspace(-1.2, 1.2, n) + srng.uniform(-0.2, 0.2, n)
        for k in range(n):
            crop = photo_crop(srng, str(names[k]), srng.uniform(0.7, 1.4), (0.7, 1.0))
            pw = srng.uniform(0.45, 0.75)
            ph = pw * crop.shape[0] / crop.shape[1]
            img = _resize(crop, int(pw * ppm), int(ph * ppm))
            b = max(2, int(0.02 * ppm))
            img = np.pad(img, ((b, b), (b, b), (0, 0)), constant_values=int(srng.choice([25, 240])))
            zc = srng.uniform(0.55, 0.9) + rng.uniform(-0.01, 0.01)
            col = int((self.wall_y[1] - ys[k]) * ppm - img.shape[1] / 2)
            row = int((self.wall_z[1] - zc) * ppm - img.shape[0] / 2)
            r0, c0 = max(row, 0), max(col, 0)
            r1, c1 = min(row + img.shape[0], h), min(col + img.shape[1], w)
            if r1 > r0 and c1 > c0:
                wall[r0:r1, c0:c1] = img[r0 - row : r1 - row, c0 - col : c1 - col]
        return wall

    def wall_plane(self):
        s = 1.0 / self.wall_ppm
        return np.array([WALL_X, self.wall_y[1], self.wall_z[1]]), np.array([0.0, -s, 0.0]), np.array([0.0, 0.0, -s])

    def side_walls(self):
        """Side walls at y = +-SIDE_Y, from the back wall to x = 0.9 (always in front of the
        scene cameras): (image, O, U, V) each, textured with a piece of the back wall."""
        s = 1.0 / self.wall_ppm
        cols = int((0.9 - WALL_X) * self.wall_ppm)
        out = []
        for sign, c0 in ((1.0, 0), (-1.0, self.wall_img.width - cols)):
            img = self.wall_img.crop((c0, 0, c0 + cols, self.wall_img.height))
            O = np.array([WALL_X, sign * SIDE_Y, self.wall_z[1]])
            out.append((img, O, np.array([s, 0.0, 0.0]), np.array([0.0, 0.0, -s])))
        return out

    # -- object looks ----------------------------------------------------------------
    def _face(self, rng, w_m: float, h_m: float, kind: str, photo: str, side: bool = False) -> Textured:
        ppm = 1400.0 * self.scale
        w, h = max(4, int(w_m * ppm)), max(4, int(h_m * ppm))
        if kind == "sponge":  # yellow foam, a green scouring layer along the bottom of the sides
            g = mirror_tile(load_photo("gravel"), h, w, 0.2 * self.scale, rng)
            rgb = tint(g, (226, 196, 70), 0.22)
            if side:
                g2 = mirror_tile(load_photo("grass"), h, w, 0.25 * self.scale, rng)
                band = int(h * 0.7)
                rgb[band:] = tint(g2[band:], (58, 120, 64), 0.35)
        else:
            for _ in range(12):  # a crop with something on it (not a patch of night sky)
                crop = photo_crop(rng, photo, w / h, (0.25, 0.7))
                if crop.mean() > 60 and crop.std() > 25:
                    break
            rgb = _resize(crop, w, h, Image.Resampling.LANCZOS)
        rgba = np.dstack([rgb, np.full((h, w), 255, np.uint8)])
        return Textured(Image.fromarray(rgba, "RGBA"))

    def _box_look(self, rng, kind, size) -> BoxLook:
        L, W, H = size
        if kind == "sponge":
            faces = {"+z": self._face(rng, L, W, "sponge", "")}
            for f, (a, b) in {"+x": (W, H), "-x": (W, H), "+y": (L, H), "-y": (L, H)}.items():
                faces[f] = self._face(rng, a, b, "sponge", "", side=True)
            return BoxLook(faces, (226, 196, 70))
        photo = str(rng.choice([p for p in COLOUR_PHOTOS if p not in ("color", "hubble_deep_field")]))
        faces = {"+z": self._face(rng, L, W, "photo", photo)}
        for f, (a, b) in {"+x": (W, H), "-x": (W, H), "+y": (L, H), "-y": (L, H)}.items():
            faces[f] = self._face(rng, a, b, "photo", photo)
        col = np.asarray(faces["+z"].image)[..., :3].reshape(-1, 3).mean(0)
        return BoxLook(faces, (int(col[0]), int(col[1]), int(col[2])))  # col: the mean RGB

    def _towel(self, rng) -> None:
        tw = self.script.towel
        ppm = 700.0 * self.scale
        h, w = int(tw.length * ppm), int(tw.width * ppm)  # rows along x, columns along y
        base = np.array([[70, 110, 170], [190, 60, 60], [230, 226, 210], [90, 150, 110]][int(rng.integers(4))])
        g = (
            mirror_tile(load_photo("grass"), h, w, 0.18 * self.scale, rng) * 0.6
            + mirror_tile(load_photo("gravel"), h, w, 0.12 * self.scale, rng) * 0.4
        )
        stripes = ((np.arange(w) * 10 // max(w, 1)) % 3 == 0).astype(np.float32)
        var = 0.05 * smooth_field(rng, h, w, 4) - 0.12 * stripes[None, :]
        tex = tint(g, base, 0.16, var)
        self.towel_full = tex
        half = h // 2
        # near half (x below the fold line) baked into the table: rows 0..half
        near = tex[:half]
        cx, cy = tw.centre
        ppm_t = self.table_ppm
        near_t = _resize(near, int(tw.width * ppm_t), int(tw.length / 2 * ppm_t))
        self._paste(self.table, near_t, cx - tw.length / 4, cy, 0.0, shadow=0.15)
        far = tex[half:]
        a = np.full(far.shape[:2], 255, np.uint8)
        self.towel_tex = Textured(Image.fromarray(np.dstack([far, a]), "RGBA"))
        back = np.clip(far.astype(np.float32) * 0.82, 0, 255).astype(np.uint8)[::-1]
        self.towel_back = Textured(Image.fromarray(np.dstack([back, a]), "RGBA"))

    def _stain(self, rng) -> None:
        st = self.script.stain
        ppm = 500.0 * self.scale
        h, w = int(st.size[0] * ppm), int(st.size[1] * ppm)
        yy, xx = np.mgrid[:h, :w]
        d = ((yy - h / 2) / (h / 2)) ** 2 + ((xx - w / 2) / (w / 2)) ** 2
        blob = 1.0 - d + 0.45 * smooth_field(rng, h, w, 4)
        alpha = np.clip(blob * 3.0, 0, 1) * 0.7
        g = mirror_tile(load_photo("gravel"), h, w, 0.2 * self.scale, rng)
        rgb = tint(g, (96, 58, 30), 0.12)
        self.stain_alpha = (alpha * 255).astype(np.uint8)
        self.stain_rgb = rgb
        self._stain_cache: dict[int, Image.Image] = {}

    def stain_image(self, alpha_scale: float) -> Image.Image:
        k = int(round(np.clip(alpha_scale, 0, 1) * 32))
        im = self._stain_cache.get(k)
        if im is None:
            a = (self.stain_alpha.astype(np.float32) * (k / 32)).astype(np.uint8)
            im = Image.fromarray(np.dstack([self.stain_rgb, a]), "RGBA")
            self._stain_cache[k] = im
        return im

    def _cabinet(self, rng) -> None:
        cab = self.script.cabinet
        sx, sy, sz = cab.size
        ppm = 900.0 * self.scale
        wood = np.array([[150, 104, 66], [200, 180, 150], [120, 80, 50], [225, 225, 220]][int(rng.integers(4))])

        def panel(w_m, h_m, shade=1.0, grain=6.0):
            w, h = max(4, int(w_m * ppm)), max(4, int(h_m * ppm))
            g = mirror_tile(load_photo("grass"), h, w, 0.35 * self.scale, rng, grain)
            rgb = tint(g, wood * shade, 0.12, 0.04 * smooth_field(rng, h, w, 3))
            return Textured(Image.fromarray(np.dstack([rgb, np.full((h, w), 255, np.uint8)]), "RGBA"))

        self.cabinet_looks = {
            "body_top": panel(sx, sy),
            "body_x": panel(sy, sz),
            "body_y": panel(sx, sz),
            "front": panel(sx * 0.94, sz * 0.7, 1.05, 8.0),
        }
        self.cabinet_colour = tuple(int(v) for v in wood)


# --------------------------------------------------------------------------------------
# drawing
# --------------------------------------------------------------------------------------
_BOX_FACES = {
    # face: (outward normal in box frame, corner signs TL, TR, BR, BL)
    "+z": ((0, 0, 1), ((-1, 1, 1), (1, 1, 1), (1, -1, 1), (-1, -1, 1))),
    "+x": ((1, 0, 0), ((1, -1, 1), (1, 1, 1), (1, 1, -1), (1, -1, -1))),
    "-x": ((-1, 0, 0), ((-1, 1, 1), (-1, -1, 1), (-1, -1, -1), (-1, 1, -1))),
    "+y": ((0, 1, 0), ((1, 1, 1), (-1, 1, 1), (-1, 1, -1), (1, 1, -1))),
    "-y": ((0, -1, 0), ((-1, -1, 1), (1, -1, 1), (1, -1, -1), (-1, -1, -1))),
    "-z": ((0, 0, -1), ((-1, -1, -1), (1, -1, -1), (1, 1, -1), (-1, 1, -1))),
}
_SIGNS = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)], dtype=np.float64)


def _rotz(yaw: float) -> np.ndarray:
    c, s = math.cos(yaw), math.sin(yaw)
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1.0]])


def _shade(n_world: np.ndarray) -> float:
    return 0.58 + 0.5 * max(0.0, float(n_world @ LIGHT))


def _hull(pts: np.ndarray) -> np.ndarray:
    """Convex hull (monotone chain) of 2-D points."""
    p = sorted(map(tuple, np.round(pts, 4)))
    if len(p) <= 2:
        return np.array(p)

    def cross(o, a, b):
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    lower: list[tuple[float, ...]] = []
    upper: list[tuple[float, ...]] = []
    for q in p:
        while len(lower) >= 2 and cross(lower[-2], lower[-1], q) <= 0:
            lower.pop()
        lower.append(q)
    for q in reversed(p):
        while len(upper) >= 2 and cross(upper[-2], upper[-1], q) <= 0:
            upper.pop()
        upper.append(q)
    return np.array(lower[:-1] + upper[:-1])


def _to_table(P: np.ndarray) -> np.ndarray:
    """Shadow of points on the table plane along the light direction."""
    P = np.asarray(P, dtype=np.float64)
    z = np.maximum(P[..., 2:3], 0.0)
    return P - z / LIGHT[2] * LIGHT


class View:
    """One camera's projection for one frame: camera model + 2-D affine (shake) on top."""

    NEAR = 0.02

    def __init__(self, cam: Camera, affine: np.ndarray, size: tuple[int, int]):
        self.cam = cam
        self.A = affine  # 2x3, nominal pixel -> frame pixel
        self.size = size
        self.scale = math.sqrt(abs(np.linalg.det(affine[:, :2])))
        self.f = cam.K[0, 0] * self.scale

    def project(self, P) -> tuple[np.ndarray, np.ndarray]:
        uv, z = self.cam.project(P)
        uv = uv @ self.A[:, :2].T + self.A[:, 2]
        return uv, z

    def depth(self, P) -> float:
        return float(self.cam.to_cam(np.asarray(P, dtype=np.float64))[..., 2].mean())


def _poly(uv: np.ndarray) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in uv]


class Painter:
    """Draws boxes, arm links and textured quads onto a PIL image for one view."""

    def __init__(self, img: Image.Image, view: View):
        self.img = img
        self.view = view
        self.draw = ImageDraw.Draw(img)
        self.W, self.H = img.size

    def _on_screen(self, uv: np.ndarray, margin=2.0) -> bool:
        return not (
            uv[:, 0].max() < -margin
            or uv[:, 1].max() < -margin
            or uv[:, 0].min() > self.W + margin
            or uv[:, 1].min() > self.H + margin
        )

    def textured_quad(self, corners: np.ndarray, tex: Image.Image) -> None:
        uv, z = self.view.project(corners)
        if z.min() < View.NEAR or not self._on_screen(uv):
            return
        x0 = max(0, int(math.floor(uv[:, 0].min())))
        y0 = max(0, int(math.floor(uv[:, 1].min())))
        x1 = min(self.W, int(math.ceil(uv[:, 0].max())) + 1)
        y1 = min(self.H, int(math.ceil(uv[:, 1].max())) + 1)
        if x1 - x0 < 1 or y1 - y0 < 1:
            return
        w, h = tex.size
        src = np.array([[0, 0], [w, 0], [w, h], [0, h]], dtype=np.float64)
        try:
            Hm = homography_from_points(src, uv)
            coeffs = pil_coeffs(Hm, (x0, y0))
        except np.linalg.LinAlgError:
            return
        patch = tex.transform(
            (x1 - x0, y1 - y0), Image.Transform.PERSPECTIVE, coeffs, Image.Resampling.BILINEAR, fillcolor=(0, 0, 0, 0)
        )
        self.img.paste(patch, (x0, y0), patch)

    def box(self, centre, R, half, look: BoxLook | None, colour=None, textures: dict | None = None) -> None:
        centre, half = np.asarray(centre, dtype=np.float64), np.asarray(half, dtype=np.float64)
        eye = self.view.cam.centre
        faces = textures if textures is not None else (look.faces if look is not None else {})
        if colour is None:
            assert look is not None  # a box is drawn with its look or an explicit colour
            colour = look.colour
        base_col = np.asarray(colour, dtype=np.float64)
        for name, (n, signs) in _BOX_FACES.items():
            nw = R @ np.asarray(n, dtype=np.float64)
            fc = centre + R @ (np.asarray(n) * half)
            if float(nw @ (eye - fc)) <= 1e-6:
                continue
            corners = centre + (np.asarray(signs, dtype=np.float64) * half) @ R.T
            shade = _shade(nw)
            tex = faces.get(name)
            if tex is not None:
                self.textured_quad(corners, tex.shaded(shade))
            else:
                uv, z = self.view.project(corners)
                if z.min() < View.NEAR or not self._on_screen(uv):
                    continue
                c = tuple(int(min(255, v * shade)) for v in base_col)
                self.draw.polygon(_poly(uv), fill=c)

    def link(self, p0, p1, radius: float, colour) -> None:
        uv, z = self.view.project(np.stack([p0, p1]))
        if z.min() < View.NEAR or not self._on_screen(uv, 200):
            return
        r0, r1 = self.view.f * radius / z[0], self.view.f * radius / z[1]
        d = uv[1] - uv[0]
        L = float(np.hypot(*d))
        if L < 1e-6:
            self.cap(p0, radius, colour)
            return
        d /= L
        n = np.array([-d[1], d[0]])
        if n[1] > 0:  # the side facing up in the image catches the light
            n = -n
        col = np.asarray(colour, dtype=np.float64)
        for frac, off, k in ((1.0, 0.0, 0.62), (0.78, 0.12, 0.86), (0.34, 0.42, 1.08), (0.12, 0.5, 1.2)):
            a0, a1 = r0 * frac, r1 * frac
            o0, o1 = n * (r0 * off), n * (r1 * off)
            quad = [uv[0] + o0 + n * a0, uv[1] + o1 + n * a1, uv[1] + o1 - n * a1, uv[0] + o0 - n * a0]
            self.draw.polygon(_poly(np.array(quad)), fill=tuple(int(min(255, v * k)) for v in col))

    def cap(self, p, radius: float, colour, ring=None) -> None:
        uv, z = self.view.project(np.asarray(p)[None])
        if z[0] < View.NEAR or not self._on_screen(uv, 100):
            return
        r = self.view.f * radius / z[0]
        (u, v), col = uv[0], np.asarray(colour, dtype=np.float64)
        self.draw.ellipse([u - r, v - r, u + r, v + r], fill=tuple(int(c * 0.7) for c in col))
        r2 = r * 0.8
        self.draw.ellipse(
            [u - r2 - 0.15 * r, v - r2 - 0.2 * r, u + r2 - 0.15 * r, v + r2 - 0.2 * r], fill=tuple(int(c) for c in col)
        )
        if ring is not None:
            r3 = r * 0.35
            self.draw.ellipse(
                [u - r3 - 0.2 * r, v - r3 - 0.25 * r, u + r3 - 0.2 * r, v + r3 - 0.25 * r],
                fill=tuple(int(min(255, c * 1.2)) for c in col),
            )


class ShadowMask:
    """Soft shadows on the table, drawn at 1/4 resolution and blurred."""

    DOWN = 4

    def __init__(self, view: View, size: tuple[int, int]):
        self.view = view
        self.size = size
        self.small = (max(2, size[0] // self.DOWN), max(2, size[1] // self.DOWN))
        self.img = Image.new("L", self.small, 0)
        self.draw = ImageDraw.Draw(self.img)
        self.any = False

    def _uv(self, P):
        uv, z = self.view.project(P)
        return uv / self.DOWN * np.array(
            [self.small[0] * self.DOWN / self.size[0], self.small[1] * self.DOWN / self.size[1]]
        ), z

    def box(self, centre, R, half, strength=150) -> None:
        corners = np.asarray(centre) + (_SIGNS * half) @ R.T
        sh = _to_table(corners)
        hull = _hull(sh[:, :2])
        if len(hull) < 3:
            return
        P = np.column_stack([hull, np.zeros(len(hull))])
        uv, z = self._uv(P)
        if z.min() < View.NEAR:
            return
        self.draw.polygon(_poly(uv), fill=strength)
        self.any = True

    def link(self, p0, p1, radius, strength=130) -> None:
        sh = _to_table(np.stack([p0, p1]))
        uv, z = self._uv(sh)
        if z.min() < View.NEAR:
            return
        w = max(1, int(round(self.view.f * 2 * radius / z.mean() / self.DOWN)))
        self.draw.line(_poly(uv), fill=strength, width=w)
        self.any = True

    def apply(self, img: Image.Image) -> Image.Image:
        """Darken ``img`` under the shadows; only the shadows' bounding box is touched."""
        if not self.any:
            return img
        m = self.img.filter(ImageFilter.BoxBlur(1.2))
        bb = m.getbbox()
        if bb is None:
            return img
        sx, sy = self.size[0] / self.small[0], self.size[1] / self.small[1]
        x0, y0 = max(0, int((bb[0] - 1) * sx)), max(0, int((bb[1] - 1) * sy))
        x1, y1 = min(self.size[0], int((bb[2] + 1) * sx) + 1), min(self.size[1], int((bb[3] + 1) * sy) + 1)
        if x1 - x0 < 1 or y1 - y0 < 1:
            return img
        # the matching region of the low-res mask, upsampled
        box = (x0 / sx, y0 / sy, x1 / sx, y1 / sy)
        region = m.resize((x1 - x0, y1 - y0), Image.Resampling.BILINEAR, box=box)
        inv = region.point(self._lut)
        part = img.crop((x0, y0, x1, y1))
        img.paste(ImageChops.multiply(part, Image.merge("RGB", (inv, inv, inv))), (x0, y0))
        return img

    _lut = [255 - (v * 115) // 255 for v in range(256)]  # up to ~45 % darker


# --------------------------------------------------------------------------------------
# sensor: lighting and noise
# --------------------------------------------------------------------------------------
class NoiseBank:
    """A few fields of unit-variance noise per episode; each frame takes a random window
    (offset + flips) of one field, so noise is fresh from frame to frame at the cost of a slice.

    Spatially the noise is slightly correlated (a [0.2, 1, 0.2] kernel in x and y, like
    demosaicing), and across channels partly shared (a luma component carrying 40% of the
    variance, like a colour-correction matrix mixing channels)."""

    FIELDS = 4
    PAD = 32

    def __init__(self, seed: int, width: int, height: int):
        rng = np.random.default_rng([seed, 401])
        h, w = height + self.PAD, width + self.PAD
        self.fields = []
        k = np.array([0.2, 1.0, 0.2], dtype=np.float32)
        for _ in range(self.FIELDS):
            luma = rng.standard_normal((h + 2, w + 2, 1), dtype=np.float32)
            chroma = rng.standard_normal((h + 2, w + 2, 3), dtype=np.float32)
            n = math.sqrt(0.4) * luma + math.sqrt(0.6) * chroma
            n = k[0] * n[:-2] + k[1] * n[1:-1] + k[2] * n[2:]
            n = k[0] * n[:, :-2] + k[1] * n[:, 1:-1] + k[2] * n[:, 2:]
            n /= float(n.std())
            self.fields.append(np.ascontiguousarray(n))

    def window(self, rng: np.random.Generator, height: int, width: int) -> np.ndarray:
        f = self.fields[int(rng.integers(self.FIELDS))]
        oy, ox = int(rng.integers(self.PAD + 1)), int(rng.integers(self.PAD + 1))
        n = f[oy : oy + height, ox : ox + width]
        flip = int(rng.integers(4))
        if flip & 1:
            n = n[::-1]
        if flip & 2:
            n = n[:, ::-1]
        return n


class SensorModel:
    """Lighting and sensor noise of one camera, applied to the rendered (noise-free) frame.

    Lighting: ``out = in * gain(t) * vignette(x, y) * white_balance[c]`` where gain(t) is a
    slow drift (two sinusoids, +-3..6 % over the episode, e.g. clouds through a window or
    auto-exposure hunting) times a mild flicker (mains light beating against the 30 Hz
    frame rate: ~0.5 % at the alias frequency plus 0.2 % random per frame); the vignette is
    a soft cos^4-like fall-off, 8-22 % darker in the corners.

    Noise (in output DN, 8-bit): Gaussian with a signal-dependent variance
        sigma^2(v) = sigma_read^2 + k_shot * v,   sigma_read ~ 1.2 DN, k_shot ~ 0.02 DN
    i.e. sigma ~ 1.2 DN in black, ~2.0 DN on mid-grey (v = 128), ~2.5 DN near white --
    what a camera ISP outputs after its own denoising, not a raw sensor. The unit noise
    comes from the episode's :class:`NoiseBank` (mildly correlated in space and across
    channels). Values are rounded and clipped to uint8.
    """

    def __init__(self, seed: int, cam_index: int, width: int, height: int, bank: NoiseBank):
        rng = np.random.default_rng([seed, 402, cam_index])
        self.seed, self.cam_index = seed, cam_index
        self.width, self.height = width, height
        self.bank = bank
        self.sigma_read = rng.uniform(1.05, 1.35)
        sigma_mid = rng.uniform(1.8, 2.2)
        self.k_shot = (sigma_mid**2 - self.sigma_read**2) / 128.0
        strength = rng.uniform(0.08, 0.22)
        yy, xx = np.mgrid[:height, :width].astype(np.float32)
        r2 = ((xx - width / 2 + 0.5) ** 2 + (yy - height / 2 + 0.5) ** 2) / ((width / 2) ** 2 + (height / 2) ** 2)
        vig = (1.0 / (1.0 + 0.5 * r2) ** 2 - 1.0) * (strength / (1 - 1 / 2.25)) + 1.0
        wb = rng.uniform(0.96, 1.04, 3).astype(np.float32)
        wb /= wb.mean()
        self.gain_map = (vig[..., None] * wb[None, None, :]).astype(np.float32)
        self.drift = (
            rng.uniform(0.03, 0.06),
            rng.uniform(15, 40),
            rng.uniform(0, 2 * math.pi),
            rng.uniform(0.01, 0.02),
            rng.uniform(3, 8),
            rng.uniform(0, 2 * math.pi),
        )
        self.flicker = (rng.uniform(0.003, 0.007), rng.uniform(8, 12), rng.uniform(0, 2 * math.pi))
        self.base_gain = rng.uniform(0.96, 1.04)
        self._y: np.ndarray | None = None
        self._s: np.ndarray | None = None

    def gain(self, t: float, rng: np.random.Generator) -> float:
        a1, p1, f1, a2, p2, f2 = self.drift
        af, ff, pf = self.flicker
        g = self.base_gain * (1 + a1 * math.sin(2 * math.pi * t / p1 + f1) + a2 * math.sin(2 * math.pi * t / p2 + f2))
        g *= 1 + af * math.sin(2 * math.pi * ff * t + pf) + 0.002 * float(rng.standard_normal())
        return g

    def apply(self, frame: np.ndarray, t: float, rng: np.random.Generator) -> np.ndarray:
        """Lighting + noise on a rendered frame; returns a new uint8 array. Work buffers are
        reused between calls (large fresh allocations cost more than the arithmetic), so one
        SensorModel must not be used from two threads at once."""
        if self._y is None:
            self._y = np.empty((self.height, self.width, 3), np.float32)
            self._s = np.empty_like(self._y)
        y, s = self._y, self._s
        assert s is not None  # allocated with self._y
        np.multiply(frame, self.gain_map, out=y)
        y *= np.float32(self.gain(t, rng))
        np.multiply(y, np.float32(self.k_shot), out=s)
        s += np.float32(self.sigma_read**2)
        np.sqrt(s, out=s)
        s *= self.bank.window(rng, self.height, self.width)
        y += s
        y += np.float32(0.5)
        np.clip(y, 0.0, 255.49, out=y)
        return y.astype(np.uint8)


# --------------------------------------------------------------------------------------
# the renderer
# --------------------------------------------------------------------------------------
SCENE_CAMERAS = {
    # name: eye, target, hfov
    "scene_left": ((1.2, 0.55, 0.72), (0.25, 0.0, 0.25), 66.0),
    "scene_right": ((1.12, -0.6, 0.78), (0.27, 0.02, 0.23), 64.0),
    "scene_top": ((0.45, 0.0, 1.55), (0.42, 0.0, 0.0), 70.0),
}
ARM_LOOKS = {
    "dyna-a1": ((196, 202, 208), (58, 104, 152)),
    "dyna-a2": ((222, 220, 210), (232, 128, 36)),
}


class Renderer:
    """Renders any camera of one episode at any time, given the arm's world state."""

    def __init__(
        self,
        *,
        seed: int,
        site: str,
        robot_id: str,
        arm: ArmModel,
        script,
        width: int,
        height: int,
        cameras: tuple[str, ...],
    ):
        self.seed, self.arm, self.script = seed, arm, script
        self.W, self.H = int(width), int(height)
        self.cameras = tuple(cameras)
        self.world = World(seed, site, robot_id, script, self.W)
        self.bank = NoiseBank(seed, self.W, self.H)
        self.link_colour, self.cap_colour = ARM_LOOKS.get(arm.name, ARM_LOOKS["dyna-a1"])
        self.sensors = {c: SensorModel(seed, stable_hash(c), self.W, self.H, self.bank) for c in self.cameras}
        self._scene: dict[str, tuple[Camera, Image.Image, int, tuple]] = {}
        self._robot_hash = stable_hash("robot", robot_id)
        self._wrist_K = intrinsics(self.W, self.H, 82.0)
        # the wrist camera in the flange frame, looking past the fingertips
        R, t = look_at((0.0, 0.072, 0.035), (0.0, -0.012, 0.26), up=(0.0, 1.0, 0.0))
        T = np.eye(4)
        T[:3, :3] = R.T
        T[:3, 3] = -R.T @ t
        self._wrist_mount = T  # camera -> flange

    # -- scene cameras ----------------------------------------------------------------
    def _scene_camera(self, name: str):
        if name in self._scene:
            return self._scene[name]
        base = SCENE_CAMERAS.get(name)
        k = stable_hash(name)
        rng_r = np.random.default_rng([self._robot_hash, stable_hash(name)])  # this cell's mounting
        rng_e = np.random.default_rng([self.seed, 501, k])  # bumped a little between sessions
        if base is None:  # an unknown scene camera name: somewhere in front of the robot
            ang = rng_r.uniform(-0.7, 0.7)
            base = ((0.4 + 0.9 * math.cos(ang), 0.9 * math.sin(ang), 0.85), (0.35, 0.0, 0.12), 64.0)
        eye = np.array(base[0]) + rng_r.uniform(-0.06, 0.06, 3) + rng_e.uniform(-0.008, 0.008, 3)
        target = np.array(base[1]) + rng_r.uniform(-0.04, 0.04, 3) + rng_e.uniform(-0.005, 0.005, 3)
        # a bigger arm gets its cameras mounted further back, aimed higher
        bigger = max(1.0, (abs(self.arm.a[1]) + abs(self.arm.a[2])) / 0.8172) - 1.0
        target[2] += 0.3 * bigger
        eye = target + (eye - target) * (1.0 + 0.75 * bigger)
        up = np.array([rng_r.uniform(-0.03, 0.03), rng_r.uniform(-0.03, 0.03), 1.0])
        R, t = look_at(eye, target, up)
        K = intrinsics(self.W, self.H, base[2] + rng_r.uniform(-2, 2))
        cam = Camera(K, R, t)
        m = max(4, int(round(0.05 * self.W)))
        canvas = self._render_canvas(cam, m)
        motion = self._camera_motion(rng_e)
        self._scene[name] = (cam, canvas, m, motion)
        return self._scene[name]

    def _render_canvas(self, cam: Camera, m: int) -> Image.Image:
        """The static background (floor, wall, table with its baked decals) for a camera,
        oversized by ``m`` pixels each side, supersampled 2x."""
        ss = 2
        Wc, Hc = (self.W + 2 * m) * ss, (self.H + 2 * m) * ss
        off = (-m, -m)
        img = Image.new("RGB", (Wc, Hc), self.world.floor_colour)
        for tex, O, U, V in self.world.side_walls():
            self._plane_into(img, cam, tex, O, U, V, off, ss)
        # back wall
        O, U, V = self.world.wall_plane()
        self._plane_into(img, cam, self.world.wall_img, O, U, V, off, ss)
        # table top and its front edge
        O, U, V = self.world.table_plane()
        self._plane_into(img, cam, self.world.table_img, O, U, V, off, ss)
        img = img.reduce(ss)
        return img

    def _plane_into(self, img, cam, tex: Image.Image, O, U, V, off, ss) -> None:
        Hm = cam.plane_homography(O, U, V)
        coeffs = pil_coeffs(Hm, off, ss)
        rgba = tex.convert("RGBA")
        # depth is affine over the plane: d(u, v) = d0 + u du + v dv. Rays meeting the plane
        # behind the camera map to points with d < 0; keep only the part in front, so that
        # such rays land on transparent texels
        fwd = cam.R[2]
        d0, du, dv = float(fwd @ (O - cam.centre)), float(fwd @ U), float(fwd @ V)
        w, h = tex.size
        corners = [d0 + a * du + b * dv for a in (0, w) for b in (0, h)]
        if min(corners) < 0.05:
            uu = np.arange(w, dtype=np.float32)[None, :]
            vv = np.arange(h, dtype=np.float32)[:, None]
            mask = ((d0 + uu * du + vv * dv) > 0.05).astype(np.uint8) * 255
            rgba.putalpha(Image.fromarray(mask))
        layer = rgba.transform(
            img.size, Image.Transform.PERSPECTIVE, coeffs, Image.Resampling.BILINEAR, fillcolor=(0, 0, 0, 0)
        )
        img.paste(layer, (0, 0), layer)

    def _camera_motion(self, rng) -> tuple:
        """Scene cameras are rigidly mounted, as in real table-top cells (ALOHA and the like):
        no drift, shake or zoom breathing -- a fixed-focus camera on a clamp does not breathe,
        and shake would be motion no real mount has. (The rng draws are kept so the rest of
        the episode's random stream is unchanged.) What changes from frame to frame in a
        scene camera is the lighting, the sensor noise and whatever moves in the scene."""
        s = self.W / 640.0
        drift = [(rng.uniform(1.0, 2.5) * s * 0.0, rng.uniform(8, 25), rng.uniform(0, 2 * math.pi)) for _ in range(2)]
        shake = [
            (rng.uniform(0.15, 0.45) * s * 0.0, rng.uniform(1.5, 6.0), rng.uniform(0, 2 * math.pi)) for _ in range(4)
        ]
        zoom = (rng.uniform(0.001, 0.003) * 0.0, rng.uniform(10, 30), rng.uniform(0, 2 * math.pi))
        return drift, shake, zoom

    def _affine(self, motion, t: float) -> np.ndarray:
        """Nominal pixel -> frame pixel for a scene camera at time t: a translation (slow drift
        plus small shake, sub-pixel) and a tiny zoom breathing; no rotation, so the background
        warp is a box resize (Pillow's separable resampler, ~2x faster than a general affine)."""
        drift, shake, zoom = motion
        dx = drift[0][0] * math.sin(2 * math.pi * t / drift[0][1] + drift[0][2])
        dy = drift[1][0] * math.sin(2 * math.pi * t / drift[1][1] + drift[1][2])
        for k, (a, f, p) in enumerate(shake):
            v = a * math.sin(2 * math.pi * f * t + p)
            if k % 2:
                dy += v
            else:
                dx += v
        sc = 1.0 + zoom[0] * math.sin(2 * math.pi * t / zoom[1] + zoom[2])
        cx, cy = self.W / 2, self.H / 2
        return np.array([[sc, 0.0, cx - sc * cx + dx], [0.0, sc, cy - sc * cy + dy]])

    # -- drawing the dynamic scene -------------------------------------------------------
    def _arm_items(self, st: WorldState, wrist: bool):
        """(depth point, draw(painter), shadow(mask)) for the arm, gripper and fingers."""
        fr = st.frames
        o = fr[:, :3, 3]
        items: list[tuple[np.ndarray, Callable[..., object], Callable[..., object] | None]] = []
        arm = self.arm
        lc, cc = self.link_colour, self.cap_colour
        if not wrist:
            # base column
            base_top = o[0] + np.array([0, 0, 0.09])
            items.append(
                (0.5 * (o[0] + base_top), lambda p, a=o[0], b=base_top: p.link(a, b, 0.078, (70, 74, 80)), None)
            )
            for k in range(1, 7):
                a, b = o[k - 1], o[k]
                if np.linalg.norm(b - a) < 1e-4:
                    continue
                r = arm.link_radius[k - 1]
                items.append(
                    (
                        0.5 * (a + b),
                        lambda p, a=a, b=b, r=r: p.link(a, b, r, lc),
                        lambda s, a=a, b=b, r=r: s.link(a, b, r),
                    )
                )
            for k in range(1, 6):
                r = arm.link_radius[min(k, 5)] * 1.22
                items.append((o[k], lambda p, c=o[k], r=r: p.cap(c, r, cc, ring=True), None))
        R6 = fr[6, :3, :3]
        fl = o[6]
        body_c = fl + R6 @ np.array([0, 0, 0.055])
        body_h = np.array([0.045, 0.032, 0.05])
        if not wrist:
            items.append(
                (
                    body_c,
                    lambda p: p.box(body_c, R6, body_h, None, colour=(52, 54, 58)),
                    lambda s: s.box(body_c, R6, body_h),
                )
            )
        half_open = st.opening / 2
        for sgn in (-1, 1):
            fc = fl + R6 @ np.array([sgn * (half_open + 0.007), 0, arm.tcp_offset - 0.022])
            fh = np.array([0.007, 0.011, 0.027])
            pad = fl + R6 @ np.array([sgn * (half_open + 0.0015), 0, arm.tcp_offset - 0.012])
            ph = np.array([0.0015, 0.0105, 0.014])
            items.append(
                (
                    fc,
                    lambda p, c=fc, h=fh, q=pad, qh=ph: (
                        p.box(c, R6, h, None, colour=(40, 41, 44)),
                        p.box(q, R6, qh, None, colour=(150, 150, 146)),
                    ),
                    lambda s, c=fc, h=fh: s.box(c, R6, h),
                )
            )
        return items

    def _object_items(self, st: WorldState, wrist: bool):
        items = []
        w = self.world
        for obj, pos, yaw in st.objects:
            R = _rotz(yaw)
            half = np.array(obj.size) / 2
            look = w.boxes[obj.name]
            items.append(
                (
                    pos,
                    lambda p, c=pos, R=R, h=half, lk=look: p.box(c, R, h, lk),
                    lambda s, c=pos, R=R, h=half: s.box(c, R, h),
                )
            )
        cab = self.script.cabinet
        if cab is not None:
            items.append(self._cabinet_item(cab, st.drawer_offset))
        return items

    def _cabinet_item(self, cab, offset: float):
        lk = self.world.cabinet_looks
        assert lk is not None  # World builds the cabinet's looks when the script has a cabinet
        sx, sy, sz = cab.size
        cx, cy = cab.centre
        side = cab.side
        body_c = np.array([cx, cy, sz / 2])
        body_h = np.array([sx / 2, sy / 2, sz / 2])
        I = np.eye(3)
        # textures per face of the body; the face towards the robot holds the drawer
        front_face = "-y" if side > 0 else "+y"
        body_tex = {
            "+z": lk["body_top"],
            "+x": lk["body_x"],
            "-x": lk["body_x"],
            "+y": lk["body_y"],
            "-y": lk["body_y"],
        }
        fy = cab.front_y
        ph = sz * 0.7
        pz = sz * 0.55
        panel_t = 0.018
        panel_c = np.array([cx, fy - side * (offset + panel_t / 2), pz])
        panel_h = np.array([sx * 0.47, panel_t / 2, ph / 2])
        panel_tex = {front_face: lk["front"]}
        drawer_c = np.array([cx, fy - side * offset / 2, pz - 0.01])
        drawer_h = np.array([sx * 0.44, offset / 2, ph / 2 - 0.012])
        hx, hy, hz = cab.handle
        handle_c = np.array([hx, hy - side * offset + side * 0.012, hz])
        handle_h = np.array([0.055, 0.006, 0.007])
        post_h = np.array([0.005, 0.012, 0.005])
        dark = tuple(int(v * 0.35) for v in self.world.cabinet_colour)

        def draw(p):
            p.box(body_c, I, body_h, None, colour=self.world.cabinet_colour, textures=body_tex)
            if offset > 1e-3:
                p.box(drawer_c, I, drawer_h, None, colour=tuple(int(v * 0.85) for v in self.world.cabinet_colour))
                # the open drawer's inside
                top = drawer_c + np.array([0, 0, drawer_h[2] + 1e-4])
                inner = top + np.array(
                    [
                        [sgx * drawer_h[0] * 0.92, sgy * drawer_h[1] * 0.95, 0]
                        for sgx, sgy in ((-1, 1), (1, 1), (1, -1), (-1, -1))
                    ]
                )
                uv, z = p.view.project(inner)
                if z.min() > View.NEAR:
                    p.draw.polygon(_poly(uv), fill=dark)
            p.box(panel_c, I, panel_h, None, colour=self.world.cabinet_colour, textures=panel_tex)
            for sx_ in (-1, 1):
                p.box(handle_c + np.array([sx_ * 0.045, side * 0.012, 0]), I, post_h, None, colour=(120, 120, 124))
            p.box(handle_c, I, handle_h, None, colour=(175, 176, 180))

        def shadow(s):
            s.box(body_c, I, body_h, strength=170)

        return (body_c, draw, shadow)

    def _decals(self, painter: Painter, st: WorldState) -> None:
        w = self.world
        stn = self.script.stain
        if stn is not None and st.stain_alpha > 0.01:
            R = _rotz(stn.yaw)
            hx, hy = stn.size[0] / 2, stn.size[1] / 2
            # texture rows along local x, columns along local y
            c = np.array([stn.centre[0], stn.centre[1], 0.0005])
            corners = c + np.array([[-hx, -hy, 0], [-hx, hy, 0], [hx, hy, 0], [hx, -hy, 0]]) @ R.T
            painter.textured_quad(corners, w.stain_image(st.stain_alpha))
        tw = self.script.towel
        if tw is not None and st.towel_edge is not None:
            cx, cy = tw.centre
            hw = tw.width / 2
            A = np.array([cx, cy - hw, 0.002])
            B = np.array([cx, cy + hw, 0.002])
            E = st.towel_edge
            C = E + np.array([0, hw, 0])
            D = E + np.array([0, -hw, 0])
            folded = E[0] < cx  # past the fold line: we see the back of the cloth
            # texture: row 0 at the fold line, columns along +y
            quad = np.stack([A, B, C, D])
            towel = w.towel_back if folded else w.towel_tex
            assert towel is not None  # World builds both sides when the script has a towel
            tex = towel.shaded(0.95 if folded else 1.0)
            if folded:
                tex = tex.transpose(Image.Transpose.FLIP_TOP_BOTTOM)
            painter.textured_quad(quad, tex)

    def _paint_dynamic(self, img: Image.Image, view: View, st: WorldState, wrist: bool) -> Image.Image:
        painter = Painter(img, view)
        self._decals(painter, st)
        items = self._object_items(st, wrist) + self._arm_items(st, wrist)
        shadows = ShadowMask(view, img.size)
        for _, _, sh in items:
            if sh is not None:
                sh(shadows)
        img = shadows.apply(img)
        painter = Painter(img, view)
        order = sorted(items, key=lambda it: -view.depth(it[0]))
        for _, draw, _ in order:
            draw(painter)
        return img

    # -- public --------------------------------------------------------------------------
    def render(self, camera: str, t: float, st: WorldState, frame_rng: np.random.Generator) -> np.ndarray:
        if camera.startswith("wrist"):
            img = self._render_wrist(st)
        else:
            cam, canvas, m, motion = self._scene_camera(camera)
            A = self._affine(motion, t)
            # the frame's rectangle in canvas pixels (inverse of A, plus the margin)
            sc = A[0, 0]
            x0, y0 = -A[0, 2] / sc + m, -A[1, 2] / sc + m
            box = (x0, y0, x0 + self.W / sc, y0 + self.H / sc)
            img = canvas.resize((self.W, self.H), Image.Resampling.BILINEAR, box=box)
            img = self._paint_dynamic(img, View(cam, A, (self.W, self.H)), st, wrist=False)
        frame = np.asarray(img)
        return self.sensors[camera].apply(frame, t, frame_rng)

    def wrist_camera(self, st: WorldState) -> Camera:
        T = st.frames[6] @ self._wrist_mount  # camera -> world
        R = T[:3, :3].T
        return Camera(self._wrist_K, R, -R @ T[:3, 3])

    def _render_wrist(self, st: WorldState) -> Image.Image:
        cam = self.wrist_camera(st)
        O, U, V = self.world.table_plane()
        Hm = cam.plane_homography(O, U, V)
        # texture pixels per output pixel around the image centre: close to the table the view
        # magnifies the texture >= 2x, and warping at half size then upsampling gives the same
        # picture for less than half the cost (Pillow's warp is the wrist camera's main cost)
        Hi = np.linalg.inv(Hm)
        c = np.array(
            [[self.W / 2, self.H / 2, 1.0], [self.W / 2 + 1, self.H / 2, 1.0], [self.W / 2, self.H / 2 + 1, 1.0]]
        )
        q = c @ Hi.T
        q = q[:, :2] / q[:, 2:]
        density = max(np.linalg.norm(q[1] - q[0]), np.linalg.norm(q[2] - q[0]))
        tex = self.world.table_img
        if density < 0.5 and self.W >= 64:
            w2, h2 = self.W // 2, self.H // 2
            img = tex.transform(
                (w2, h2),
                Image.Transform.PERSPECTIVE,
                pil_coeffs(Hm, out_scale=w2 / self.W),
                Image.Resampling.BILINEAR,
                fillcolor=self.world.floor_colour,
            ).resize((self.W, self.H), Image.Resampling.BILINEAR)
        else:
            img = tex.transform(
                (self.W, self.H),
                Image.Transform.PERSPECTIVE,
                pil_coeffs(Hm),
                Image.Resampling.BILINEAR,
                fillcolor=self.world.floor_colour,
            )
        A = np.array([[1.0, 0, 0], [0, 1.0, 0]])
        return self._paint_dynamic(img, View(cam, A, (self.W, self.H)), st, wrist=True)
