"""A scripted 6-DOF arm with a two-finger gripper: kinematics, task scripts, sensor streams.

Everything here is a pure function of the episode seed and the script parameters, so an
episode can be regenerated bit-for-bit. Time ``t`` is in seconds since the episode start.

Kinematics: standard Denavit-Hartenberg chains with UR5e / UR10e geometry (the sample
fleet's "dyna-a1" / "dyna-a2"), base yawed by pi so that the arm works along +x. World
frame: x forward over the table, y left, z up; the table top is z = 0, the base at the
origin. The tool (TCP = centre between the fingertips) points down (-z) during the tasks,
its x axis is the direction in which the fingers open.

Timing model: a task script is a list of joint-space waypoints (solved by IK from
Cartesian targets) joined by minimum-jerk (quintic) segments, plus an independent
gripper-opening track. The *measured* joint positions follow the plan with a lag of
about 20 ms and a small smooth tracking error; the commanded ``action`` stream leads the
plan by ~40 ms, so actions lead measurements by ~60 ms.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import numpy as np

from ..raw_format import SampleStream

G = 9.81
JOINT_LABELS = [f"joint{i}" for i in range(6)] + ["gripper"]
ACTION_LABELS = JOINT_LABELS + ["gripper_cmd"]
TASKS = ("pick_place", "fold_towel", "open_drawer", "wipe_table")


# --------------------------------------------------------------------------------------
# kinematics
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ArmModel:
    name: str
    d: tuple[float, ...]
    a: tuple[float, ...]
    alpha: tuple[float, ...]
    link_mass: tuple[float, ...]
    link_radius: tuple[float, ...]  # rendering: radius of each segment o_{k-1} -> o_k
    joint_inertia: tuple[float, ...]  # effective reflected inertia per joint, kg m^2
    tool_mass: float = 0.9  # gripper + flange adapter
    tcp_offset: float = 0.145  # flange -> fingertip centre along tool z
    max_opening: float = 0.085  # Robotiq 2F-85-like
    knuckle_max: float = 0.8  # gripper joint (rad) at fully closed
    base_yaw: float = math.pi

    def opening_to_joint(self, opening):
        return self.knuckle_max * (1.0 - np.asarray(opening) / self.max_opening)


_HALF_PI = math.pi / 2
ARM_MODELS: dict[str, ArmModel] = {
    # UR5e geometry
    "dyna-a1": ArmModel(
        "dyna-a1",
        d=(0.1625, 0.0, 0.0, 0.1333, 0.0997, 0.0996),
        a=(0.0, -0.425, -0.3922, 0.0, 0.0, 0.0),
        alpha=(_HALF_PI, 0.0, 0.0, _HALF_PI, -_HALF_PI, 0.0),
        link_mass=(3.761, 8.058, 2.846, 1.37, 1.3, 0.365),
        link_radius=(0.062, 0.054, 0.044, 0.038, 0.038, 0.034),
        joint_inertia=(0.9, 0.9, 0.45, 0.12, 0.12, 0.1),
    ),
    # UR10e geometry (the same fields as dyna-a1's above: two arms' data, not code to share)
    "dyna-a2": ArmModel(
        "dyna-a2",
        d=(0.1807, 0.0, 0.0, 0.17415, 0.11985, 0.11655),
        a=(0.0, -0.6127, -0.57155, 0.0, 0.0, 0.0),
        alpha=(_HALF_PI, 0.0, 0.0, _HALF_PI, -_HALF_PI, 0.0),
        link_mass=(7.369, 13.051, 3.989, 2.1, 1.98, 0.615),
        link_radius=(0.075, 0.064, 0.052, 0.045, 0.045, 0.04),
        joint_inertia=(2.0, 2.0, 0.9, 0.2, 0.2, 0.15),
        tool_mass=1.1,
    ),
}


def stable_hash(*parts) -> int:
    """A process-independent 32-bit hash (Python's hash() is salted per process)."""
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(h[:4], "little")


def arm_model(name: str) -> ArmModel:
    """The kinematics for a robot model name; unknown names map deterministically onto one."""
    if name in ARM_MODELS:
        return ARM_MODELS[name]
    keys = sorted(ARM_MODELS)
    return ARM_MODELS[keys[stable_hash("arm", name) % len(keys)]]


def _dh(theta, d, a, alpha):
    n = theta.shape[0]
    ct, st = np.cos(theta), np.sin(theta)
    ca, sa = math.cos(alpha), math.sin(alpha)
    T = np.zeros((n, 4, 4))
    T[:, 0, 0] = ct
    T[:, 0, 1] = -st * ca
    T[:, 0, 2] = st * sa
    T[:, 0, 3] = a * ct
    T[:, 1, 0] = st
    T[:, 1, 1] = ct * ca
    T[:, 1, 2] = -ct * sa
    T[:, 1, 3] = a * st
    T[:, 2, 1] = sa
    T[:, 2, 2] = ca
    T[:, 2, 3] = d
    T[:, 3, 3] = 1.0
    return T


def fk_all(arm: ArmModel, q) -> np.ndarray:
    """Forward kinematics for q (N, >=6): world transforms (N, 8, 4, 4) of
    [base, frame1..frame6 (flange), tcp]."""
    q = np.atleast_2d(np.asarray(q, dtype=np.float64))
    n = q.shape[0]
    out = np.empty((n, 8, 4, 4))
    cb, sb = math.cos(arm.base_yaw), math.sin(arm.base_yaw)
    T = np.broadcast_to(np.array([[cb, -sb, 0, 0], [sb, cb, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1.0]]), (n, 4, 4)).copy()
    out[:, 0] = T
    for i in range(6):
        T = T @ _dh(q[:, i], arm.d[i], arm.a[i], arm.alpha[i])
        out[:, i + 1] = T
    tcp = np.eye(4)
    tcp[2, 3] = arm.tcp_offset
    out[:, 7] = T @ tcp
    return out


def tool_rotation(yaw: float) -> np.ndarray:
    """Tool pointing down (z = -world z), fingers opening along (cos yaw, sin yaw, 0)."""
    x = np.array([math.cos(yaw), math.sin(yaw), 0.0])
    z = np.array([0.0, 0.0, -1.0])
    y = np.cross(z, x)
    return np.stack([x, y, z], axis=1)


def _rotvec(R: np.ndarray) -> np.ndarray:
    c = np.clip((np.trace(R) - 1.0) / 2.0, -1.0, 1.0)
    ang = math.acos(c)
    v = np.array([R[2, 1] - R[1, 2], R[0, 2] - R[2, 0], R[1, 0] - R[0, 1]])
    if ang < 1e-9:
        return 0.5 * v
    s = math.sin(ang)
    if s < 1e-6:  # ~pi: axis from the symmetric part
        k = int(np.argmax(np.diag(R)))
        axis = (R[:, k] + np.eye(3)[k]) / math.sqrt(max(2.0 * (1.0 + R[k, k]), 1e-12))
        return axis * ang
    return v * (ang / (2.0 * s))


def ik(arm: ArmModel, pos, R_target, q_seed, *, tol=1e-7, max_iter=300) -> np.ndarray:
    """Damped-least-squares IK on the TCP pose, seeded at ``q_seed`` (6,)."""
    q = np.array(q_seed[:6], dtype=np.float64)
    pos = np.asarray(pos, dtype=np.float64)
    eps = 1e-6
    for _ in range(max_iter):
        T = fk_all(arm, q)[0, 7]
        e = np.concatenate([pos - T[:3, 3], _rotvec(R_target @ T[:3, :3].T)])
        if np.linalg.norm(e) < tol:
            return _unwrap_to(q, np.asarray(q_seed[:6], dtype=np.float64))
        qs = q[None, :] + eps * np.eye(6)
        Ts = fk_all(arm, qs)[:, 7]
        J = np.empty((6, 6))
        for j in range(6):
            J[:3, j] = (Ts[j, :3, 3] - T[:3, 3]) / eps
            J[3:, j] = _rotvec(Ts[j, :3, :3] @ T[:3, :3].T) / eps
        lam2 = 1e-4
        dq = J.T @ np.linalg.solve(J @ J.T + lam2 * np.eye(6), e)
        m = np.max(np.abs(dq))
        if m > 0.3:
            dq *= 0.3 / m
        q = q + dq
    T = fk_all(arm, q)[0, 7]
    err = np.linalg.norm(pos - T[:3, 3])
    if err > 1e-4:
        raise RuntimeError(f"IK did not converge for target {pos} (error {err:.2e} m)")
    return _unwrap_to(q, np.asarray(q_seed[:6], dtype=np.float64))


def _unwrap_to(q: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """The same pose with every revolute joint within pi of the seed (no needless 2*pi turns)."""
    return seed + (q - seed + math.pi) % (2 * math.pi) - math.pi


def rot_to_quat(R: np.ndarray) -> np.ndarray:
    """Rotation matrices (N, 3, 3) -> unit quaternions (N, 4) as x y z w, sign-continuous."""
    R = np.asarray(R)
    n = R.shape[0]
    tr = R[:, 0, 0] + R[:, 1, 1] + R[:, 2, 2]
    cand = np.stack([tr, R[:, 0, 0], R[:, 1, 1], R[:, 2, 2]], axis=1)
    k = np.argmax(cand, axis=1)
    q = np.empty((n, 4))
    # w largest
    m = k == 0
    s = np.sqrt(np.maximum(1.0 + tr[m], 1e-12)) * 2
    q[m] = np.stack(
        [(R[m, 2, 1] - R[m, 1, 2]) / s, (R[m, 0, 2] - R[m, 2, 0]) / s, (R[m, 1, 0] - R[m, 0, 1]) / s, 0.25 * s], axis=1
    )
    m = k == 1
    s = np.sqrt(np.maximum(1.0 + R[m, 0, 0] - R[m, 1, 1] - R[m, 2, 2], 1e-12)) * 2
    q[m] = np.stack(
        [0.25 * s, (R[m, 0, 1] + R[m, 1, 0]) / s, (R[m, 0, 2] + R[m, 2, 0]) / s, (R[m, 2, 1] - R[m, 1, 2]) / s], axis=1
    )
    m = k == 2
    s = np.sqrt(np.maximum(1.0 + R[m, 1, 1] - R[m, 0, 0] - R[m, 2, 2], 1e-12)) * 2
    q[m] = np.stack(
        [(R[m, 0, 1] + R[m, 1, 0]) / s, 0.25 * s, (R[m, 1, 2] + R[m, 2, 1]) / s, (R[m, 0, 2] - R[m, 2, 0]) / s], axis=1
    )
    m = k == 3
    s = np.sqrt(np.maximum(1.0 + R[m, 2, 2] - R[m, 0, 0] - R[m, 1, 1], 1e-12)) * 2
    q[m] = np.stack(
        [(R[m, 0, 2] + R[m, 2, 0]) / s, (R[m, 1, 2] + R[m, 2, 1]) / s, 0.25 * s, (R[m, 1, 0] - R[m, 0, 1]) / s], axis=1
    )
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    # sign continuity (q and -q are the same rotation; a stream should not flip)
    if n:
        if q[0, 3] < 0:
            q[0] = -q[0]
        flips = np.einsum("ij,ij->i", q[1:], q[:-1]) < 0
        sign = np.cumprod(np.where(flips, -1.0, 1.0))
        q[1:] *= sign[:, None]
    return q


def yaw_of(R: np.ndarray) -> float:
    return math.atan2(R[1, 0], R[0, 0])


def closest_yaw(target: float, current: float, period: float = math.pi) -> float:
    """target + k*period closest to current."""
    k = round((current - target) / period)
    return target + k * period


# --------------------------------------------------------------------------------------
# trajectories
# --------------------------------------------------------------------------------------
class Quintic:
    """Piecewise minimum-jerk interpolation through knots; rest (zero vel/acc) at each knot."""

    def __init__(self, times, values):
        self.times = np.asarray(times, dtype=np.float64)
        self.values = np.asarray(values, dtype=np.float64)
        if self.values.ndim == 1:
            self.values = self.values[:, None]
        if len(self.times) < 2:
            self.times = np.array([self.times[0], self.times[0] + 1.0])
            self.values = np.repeat(self.values[:1], 2, axis=0)
        if np.any(np.diff(self.times) <= 0):
            raise ValueError("knot times must be strictly increasing")

    def __call__(self, t, deriv: int = 0) -> np.ndarray:
        t = np.atleast_1d(np.asarray(t, dtype=np.float64))
        k = len(self.times)
        idx = np.clip(np.searchsorted(self.times, t, side="right") - 1, 0, k - 2)
        t0 = self.times[idx]
        T = self.times[idx + 1] - t0
        tau = np.clip((t - t0) / T, 0.0, 1.0)
        dv = self.values[idx + 1] - self.values[idx]
        if deriv == 0:
            s = tau**3 * (10.0 - 15.0 * tau + 6.0 * tau**2)
            return self.values[idx] + dv * s[:, None]
        if deriv == 1:
            s = 30.0 * tau**2 * (1.0 - tau) ** 2 / T
        elif deriv == 2:
            s = 60.0 * tau * (1.0 - tau) * (1.0 - 2.0 * tau) / T**2
        else:
            raise ValueError(deriv)
        return dv * s[:, None]


# --------------------------------------------------------------------------------------
# task scripts
# --------------------------------------------------------------------------------------
@dataclass
class BoxObject:
    """A rigid box the gripper can carry. Pose = centre (x, y, z) and yaw about z."""

    name: str
    kind: str  # "box" | "sponge"
    size: tuple[float, float, float]  # length (local x), width (local y), height
    pos: tuple[float, float, float]
    yaw: float
    mass: float
    attach_t: float | None = None  # plan time at which the fingers hold it
    detach_t: float | None = None
    detach_kind: str = ""  # "release" | "slip"
    place: tuple[float, float] | None = None  # where the script means to put it down (x, y)


@dataclass
class Towel:
    centre: tuple[float, float]
    length: float  # along x (fold direction)
    width: float  # along y
    attach_t: float | None = None
    detach_t: float | None = None
    detach_kind: str = ""


@dataclass
class Cabinet:
    centre: tuple[float, float]
    size: tuple[float, float, float]  # x extent, y extent, height
    side: float = 1.0  # +1: cabinet left of the robot (+y), drawer front facing -y; -1: mirrored
    drawer_max: float = 0.2
    attach_t: float | None = None
    detach_t: float | None = None
    detach_kind: str = ""

    @property
    def front_y(self) -> float:
        return self.centre[1] - self.side * self.size[1] / 2

    @property
    def handle(self) -> tuple[float, float, float]:
        return (self.centre[0], self.front_y - self.side * 0.032, self.size[2] * 0.55)


@dataclass
class Stain:
    centre: tuple[float, float]
    size: tuple[float, float]
    yaw: float
    wipe_t0: float | None = None
    wipe_t1: float | None = None
    effective: bool = True


@dataclass
class Script:
    task: str
    success: bool
    failure_mode: str
    arm_times: list[float]
    arm_q: list[np.ndarray]
    grip_times: list[float]
    grip_open: list[float]
    grip_cmd: list[tuple[float, float]]  # (t, cmd) steps, cmd 0 = open, 1 = close
    objects: list[BoxObject] = field(default_factory=list)
    towel: Towel | None = None
    cabinet: Cabinet | None = None
    stain: Stain | None = None
    impulses: list[tuple[float, float, tuple[float, float, float]]] = field(default_factory=list)
    press: list[tuple[float, float, float]] = field(default_factory=list)  # (t0, t1, normal N)
    pull: list[tuple[float, float, tuple[float, float, float]]] = field(default_factory=list)
    steps: list[tuple[str, float]] = field(default_factory=list)  # (procedure step, plan time it starts)
    failed_step: int | None = None  # index into steps of the step where the task failed
    end_t: float = 0.0

    def scale_time(self, k: float, shift: float = 0.0) -> None:
        def f(t: float) -> float:
            return t * k + shift

        def f_opt(t: float | None) -> float | None:  # an unset time stays unset
            return None if t is None else f(t)

        self.arm_times = [f(t) for t in self.arm_times]
        self.grip_times = [f(t) for t in self.grip_times]
        self.grip_cmd = [(f(t), c) for t, c in self.grip_cmd]
        for o in [*self.objects, self.towel, self.cabinet]:
            if o is not None:
                o.attach_t, o.detach_t = f_opt(o.attach_t), f_opt(o.detach_t)
        if self.stain is not None:
            self.stain.wipe_t0, self.stain.wipe_t1 = f_opt(self.stain.wipe_t0), f_opt(self.stain.wipe_t1)
        self.impulses = [(f(t), m, d) for t, m, d in self.impulses]
        self.press = [(f(a), f(b), n) for a, b, n in self.press]
        self.pull = [(f(a), f(b), v) for a, b, v in self.pull]
        self.steps = [(n, f(t)) for n, t in self.steps]
        self.end_t = f(self.end_t)


class _Builder:
    def __init__(self, arm: ArmModel, rng: np.random.Generator):
        self.arm = arm
        self.rng = rng
        seed_q = np.array([0.0, -1.9, 1.9, -1.57, -1.57, 0.0])
        self.home_pos = np.array([0.33 + rng.uniform(-0.02, 0.02), rng.uniform(-0.03, 0.03), 0.33])
        self.q_home = ik(arm, self.home_pos, tool_rotation(-_HALF_PI), seed_q)
        self.t = 0.0
        self.q = self.q_home
        self.yaw = -_HALF_PI
        self.pos = self.home_pos.copy()
        self.arm_times = [0.0]
        self.arm_q = [self.q_home]
        self.opening = arm.max_opening
        self.grip_times = [0.0]
        self.grip_open = [self.opening]
        self.grip_cmd: list[tuple[float, float]] = [(0.0, 0.0)]
        self.steps: list[tuple[str, float]] = []
        self.failed_step: int | None = None

    def step(self, name: str) -> None:
        """The task's standard procedure enters step ``name`` now (ground truth for the segmenter)."""
        self.steps.append((name, self.t))

    def fails_here(self) -> None:
        """The task fails during the current step."""
        self.failed_step = len(self.steps) - 1

    def _dur(self, base: float) -> float:
        return base * self.rng.uniform(0.85, 1.2)

    def move(self, pos, yaw=None, dur=1.0) -> tuple[float, float]:
        yaw = self.yaw if yaw is None else yaw
        q = ik(self.arm, pos, tool_rotation(yaw), self.q)
        t0 = self.t
        self.t += self._dur(dur)
        self.arm_times.append(self.t)
        self.arm_q.append(q)
        self.q, self.yaw, self.pos = q, yaw, np.asarray(pos, dtype=float)
        return t0, self.t

    def move_joints(self, q, dur) -> None:
        self.t += self._dur(dur)
        self.arm_times.append(self.t)
        self.arm_q.append(np.asarray(q, dtype=float))
        self.q = np.asarray(q, dtype=float)
        T = fk_all(self.arm, self.q)[0, 7]
        self.pos, self.yaw = T[:3, 3].copy(), yaw_of(T[:3, :3])

    def pause(self, dur) -> None:
        self.t += self._dur(dur)
        self.arm_times.append(self.t)
        self.arm_q.append(self.q)

    def grip(self, opening: float, dur: float, at: float | None = None) -> float:
        """Move the fingers to ``opening`` over ``dur`` starting at ``at`` (default now)."""
        t0 = self.t if at is None else at
        if t0 > self.grip_times[-1] + 1e-6:
            self.grip_times.append(t0)
            self.grip_open.append(self.opening)
        else:
            t0 = self.grip_times[-1] + 1e-3
            self.grip_times.append(t0)
            self.grip_open.append(self.opening)
        self.grip_times.append(t0 + dur)
        self.grip_open.append(opening)
        self.opening = opening
        return t0 + dur

    def command(self, cmd: float, at: float | None = None) -> None:
        self.grip_cmd.append((self.t if at is None else at, cmd))

    def grasp(self, width: float, miss: bool) -> float:
        """Close the fingers (arm still); returns the contact time (or the closed time on a miss)."""
        self.command(1.0)
        target = 0.0 if miss else max(width - 0.001, 0.0)
        dur = 0.3 + 0.25 * (self.opening - target) / self.arm.max_opening
        t_contact = self.grip(target, dur)
        self.pause(0.35 + dur)
        return t_contact

    def release(self) -> float:
        self.command(0.0)
        t0 = self.t
        self.grip(self.arm.max_opening, 0.35)
        self.pause(0.45)
        return t0 + 0.05

    def home(self, dur=1.3) -> None:
        self.move_joints(self.q_home, dur)

    def script(self, task, success, failure_mode) -> Script:
        return Script(
            task,
            success,
            failure_mode,
            self.arm_times,
            self.arm_q,
            self.grip_times,
            self.grip_open,
            self.grip_cmd,
            steps=self.steps,
            failed_step=self.failed_step,
        )


def _place_boxes(rng, n, region, min_gap=0.14):
    pts: list[np.ndarray] = []
    for _ in range(200):
        p = np.array([rng.uniform(*region[0]), rng.uniform(*region[1])])
        if all(np.linalg.norm(p - q) > min_gap for q in pts):
            pts.append(p)
            if len(pts) == n:
                break
    while len(pts) < n:  # pathological: stack along y
        pts.append(np.array([region[0][0], region[1][0] + 0.15 * len(pts)]))
    return pts


def _pick_place(b: _Builder, rng, success, duration_s) -> Script:
    n_obj = 2 if (duration_s >= 12.5 and rng.random() < 0.65) else 1
    side = 1.0 if rng.random() < 0.5 else -1.0
    pick_y, place_y = ((-0.32, -0.05), (0.08, 0.30)) if side > 0 else ((0.05, 0.32), (-0.30, -0.08))
    picks = _place_boxes(rng, n_obj, ((0.38, 0.58), pick_y))
    places = _place_boxes(rng, n_obj, ((0.36, 0.56), place_y))
    failure_mode = "" if success else ("miss" if rng.random() < 0.5 else "slip")
    fail_idx = int(rng.integers(n_obj))
    objects = []
    for k in range(n_obj):
        size = (rng.uniform(0.055, 0.09), rng.uniform(0.038, 0.062), rng.uniform(0.04, 0.075))
        objects.append(
            BoxObject(
                f"box{k}",
                "box",
                size,
                (*picks[k], size[2] / 2),
                rng.uniform(-math.pi, math.pi),
                rng.uniform(0.12, 0.45),
            )
        )
    b.step("reach")
    b.pause(0.3)
    impulses = []
    for k, obj in enumerate(objects):
        fail = not success and k == fail_idx
        L, W, H = obj.size
        yaw_g = closest_yaw(obj.yaw + _HALF_PI, b.yaw)
        z_g = max(H - 0.022, 0.014)
        gx, gy = obj.pos[0], obj.pos[1]
        if fail and failure_mode == "miss":  # fingers come down past the end of the box
            off = L / 2 + 0.03
            gx, gy = gx + off * math.cos(obj.yaw), gy + off * math.sin(obj.yaw)
        b.move((gx, gy, H + 0.12), yaw_g, 1.4)
        b.move((gx, gy, z_g), yaw_g, 0.8)
        b.step("grasp")
        if fail and failure_mode == "miss":
            b.fails_here()
        t_c = b.grasp(W, miss=(fail and failure_mode == "miss"))
        if not (fail and failure_mode == "miss"):
            obj.attach_t = t_c
            impulses.append((t_c, rng.uniform(3.0, 6.0), (0.0, 0.0, 1.0)))
        b.step("transport")
        if fail and failure_mode == "slip":
            b.fails_here()
        b.move((gx, gy, 0.2), yaw_g, 0.8)
        px, py = places[k]
        obj.place = (float(px), float(py))
        yaw_p = closest_yaw(rng.uniform(-0.6, 0.6) + b.yaw, b.yaw)
        t0, t1 = b.move((px, py, 0.2), yaw_p, 1.5)
        if fail and failure_mode == "slip":
            ts = t0 + rng.uniform(0.3, 0.6) * (t1 - t0)
            obj.detach_t, obj.detach_kind = ts, "slip"
            b.grip(0.0, 0.12, at=ts)
            impulses.append((ts, -rng.uniform(2.0, 4.0), (0.0, 0.0, 1.0)))
        _, t_touch = b.move((px, py, z_g + 0.002), yaw_p, 0.8)
        if obj.attach_t is not None and obj.detach_t is None:
            impulses.append((t_touch - 0.05, rng.uniform(6.0, 14.0), (0.0, 0.0, 1.0)))
        b.step("release")
        t_r = b.release()
        if obj.attach_t is not None and obj.detach_t is None:
            obj.detach_t, obj.detach_kind = t_r, "release"
        b.step("reach" if k + 1 < n_obj else "return")  # the retreat starts the next reach
        b.move((px, py, 0.2), yaw_p, 0.6)
    b.home()
    s = b.script("pick_place", success, failure_mode)
    s.objects, s.impulses = objects, impulses
    return s


def _fold_towel(b: _Builder, rng, success, duration_s) -> Script:
    L, W = rng.uniform(0.24, 0.32), rng.uniform(0.2, 0.27)
    cx, cy = rng.uniform(0.44, 0.52), rng.uniform(-0.14, 0.06)
    towel = Towel((cx, cy), L, W)
    failure_mode = "" if success else "slip"
    yaw_g = closest_yaw(0.0, b.yaw)
    ex = cx + L / 2
    b.step("reach")
    b.pause(0.3)
    b.move((ex - 0.005, cy, 0.12), yaw_g, 1.4)
    b.move((ex - 0.012, cy, 0.004), yaw_g, 0.9)
    b.step("grasp")
    t_c = b.grasp(0.003, miss=False)
    towel.attach_t = t_c
    impulses = [(t_c, rng.uniform(2.0, 4.0), (0.0, 0.0, 1.0))]
    b.step("fold")
    if not success:
        b.fails_here()
    t0, t1 = b.move((cx + L * 0.22, cy, 0.13), yaw_g, 0.9)
    if not success:
        ts = t0 + rng.uniform(0.45, 0.8) * (t1 - t0)
        towel.detach_t, towel.detach_kind = ts, "slip"
        b.grip(0.0, 0.1, at=ts)
    b.move((cx - L * 0.12, cy, 0.12), yaw_g, 0.9)
    b.move((cx - L / 2 + 0.015, cy, 0.02), yaw_g, 0.9)
    b.step("release")
    t_r = b.release()
    if towel.detach_t is None:
        towel.detach_t, towel.detach_kind = t_r, "release"
    b.step("smooth")  # pressing along the fold line, then home
    b.move((cx - L / 2 + 0.015, cy, 0.15), yaw_g, 0.6)
    # smooth the fold: press along the fold line
    b.move((cx - 0.02, cy - W * 0.3, 0.03), yaw_g, 0.9)
    b.move((cx - 0.02, cy + W * 0.3, 0.03), yaw_g, 0.9)
    b.move((cx - 0.02, cy + W * 0.3, 0.15), yaw_g, 0.5)
    b.home()
    s = b.script("fold_towel", success, failure_mode)
    s.towel, s.impulses = towel, impulses
    return s


def _open_drawer(b: _Builder, rng, success, duration_s) -> Script:
    size = (rng.uniform(0.3, 0.36), rng.uniform(0.26, 0.3), rng.uniform(0.19, 0.23))
    side = 1.0 if rng.random() < 0.5 else -1.0
    cab = Cabinet((rng.uniform(0.47, 0.54), side * rng.uniform(0.4, 0.45)), size, side)
    failure_mode = "" if success else "slip"
    hx, hy, hz = cab.handle
    yaw_g = closest_yaw(_HALF_PI, b.yaw)
    d_open = rng.uniform(0.13, 0.17)
    b.step("reach")
    b.pause(0.3)
    b.move((hx, hy, hz + 0.11), yaw_g, 1.4)
    b.move((hx, hy, hz + 0.005), yaw_g, 0.8)
    b.step("grasp")
    t_c = b.grasp(0.014, miss=False)
    cab.attach_t = t_c
    impulses = [(t_c, rng.uniform(3.0, 5.0), (0.0, 0.0, 1.0))]
    b.step("pull")
    if not success:
        b.fails_here()
    t0, t1 = b.move((hx, hy - side * d_open, hz + 0.005), yaw_g, 1.7)
    pull_vec = (0.0, side * rng.uniform(8.0, 14.0), 0.0)  # the drawer resists the pull
    pull = [(t0, t1, pull_vec)]
    impulses.append((t0 + 0.1, rng.uniform(6.0, 10.0), (0.0, side, 0.0)))  # breakaway
    if not success:
        ts = t0 + rng.uniform(0.2, 0.3) * (t1 - t0)
        cab.detach_t, cab.detach_kind = ts, "slip"
        b.grip(0.0, 0.1, at=ts)
        pull = [(t0, ts, pull_vec)]
        impulses.append((ts, -rng.uniform(4.0, 8.0), (0.0, side, 0.0)))
    b.step("release")
    t_r = b.release()
    if cab.detach_t is None:
        cab.detach_t, cab.detach_kind = t_r, "release"
    b.step("return")
    b.move((hx, hy - side * (d_open + 0.05), hz + 0.12), yaw_g, 0.8)
    b.home()
    s = b.script("open_drawer", success, failure_mode)
    s.cabinet, s.impulses, s.pull = cab, impulses, pull
    return s


def _wipe_table(b: _Builder, rng, success, duration_s) -> Script:
    side = 1.0 if rng.random() < 0.5 else -1.0
    size = (rng.uniform(0.09, 0.11), rng.uniform(0.055, 0.065), rng.uniform(0.03, 0.04))
    sp = (rng.uniform(0.36, 0.44), side * rng.uniform(0.2, 0.28))
    sponge = BoxObject(
        "sponge",
        "sponge",
        size,
        (*sp, size[2] / 2),
        rng.uniform(-0.5, 0.5) + _HALF_PI,
        rng.uniform(0.03, 0.06),
        place=sp,
    )
    stain = Stain(
        (rng.uniform(0.46, 0.54), -side * rng.uniform(0.02, 0.12)),
        (rng.uniform(0.12, 0.18), rng.uniform(0.09, 0.13)),
        rng.uniform(-0.6, 0.6),
    )
    failure_mode = "" if success else "slip"
    L, W, H = size
    yaw_g = closest_yaw(sponge.yaw + _HALF_PI, b.yaw)
    z_g = max(H - 0.015, 0.012)
    b.step("reach")
    b.pause(0.3)
    b.move((sp[0], sp[1], H + 0.12), yaw_g, 1.3)
    b.move((sp[0], sp[1], z_g), yaw_g, 0.7)
    b.step("grasp")
    t_c = b.grasp(W, miss=False)
    sponge.attach_t = t_c
    impulses = [(t_c, rng.uniform(2.0, 4.0), (0.0, 0.0, 1.0))]
    b.step("wipe")  # carry the sponge over, scrub, bring it back
    if not success:
        b.fails_here()
    b.move((sp[0], sp[1], 0.16), yaw_g, 0.7)
    sx, sy = stain.centre
    t0, t1 = b.move((sx, sy, 0.12), yaw_g, 1.2)
    if not success:
        ts = t0 + rng.uniform(0.25, 0.6) * (t1 - t0)
        sponge.detach_t, sponge.detach_kind = ts, "slip"
        b.grip(0.0, 0.12, at=ts)
        stain.effective = False
    z_w = z_g - 0.004  # pressing into the table
    n_strokes = int(rng.integers(4, 7))
    half = 0.06 + 0.3 * stain.size[1]
    xs = np.linspace(sx - stain.size[0] * 0.4, sx + stain.size[0] * 0.4, n_strokes)
    b.move((xs[0], sy - half, z_w), yaw_g, 0.7)
    t_w0 = b.t
    for k, x in enumerate(xs):
        y = sy + half if k % 2 == 0 else sy - half
        b.move((x, y, z_w), yaw_g, 0.6)
        if k + 1 < n_strokes:
            b.move((xs[k + 1], y, z_w), yaw_g, 0.22)
    t_w1 = b.t
    stain.wipe_t0, stain.wipe_t1 = t_w0, t_w1
    press = [(t_w0 - 0.1, t_w1, rng.uniform(8.0, 14.0))] if success else []
    b.move((xs[-1], b.pos[1], 0.16), yaw_g, 0.6)
    if success:
        b.move((sp[0], sp[1], 0.12), yaw_g, 1.1)
        _, t_touch = b.move((sp[0], sp[1], z_g + 0.002), yaw_g, 0.7)
        impulses.append((t_touch - 0.05, rng.uniform(4.0, 8.0), (0.0, 0.0, 1.0)))
        b.step("release")
        t_r = b.release()
        sponge.detach_t, sponge.detach_kind = t_r, "release"
        b.step("return")
        b.move((sp[0], sp[1], 0.16), yaw_g, 0.5)
    else:
        b.step("release")
        b.release()
        b.step("return")
    b.home()
    s = b.script("wipe_table", success, failure_mode)
    s.objects, s.stain, s.impulses, s.press = [sponge], stain, impulses, press
    return s


_TASK_BUILDERS = {
    "pick_place": _pick_place,
    "fold_towel": _fold_towel,
    "open_drawer": _open_drawer,
    "wipe_table": _wipe_table,
}


def build_script(task: str, arm: ArmModel, seed: int, success: bool, duration_s: float) -> Script:
    """The scripted task for an episode, time-scaled to fit ``duration_s`` (with idle margins)."""
    if task not in _TASK_BUILDERS:
        raise ValueError(f"unknown task {task!r}; known: {', '.join(TASKS)}")
    rng = np.random.default_rng([seed, 101])
    b = _Builder(arm, rng)
    s = _TASK_BUILDERS[task](b, rng, success, duration_s)
    s.end_t = b.t
    lead_in = min(0.3, 0.04 * duration_s)
    avail = max(duration_s - lead_in - min(0.5, 0.06 * duration_s), 0.2 * duration_s)
    k = min(avail / b.t, 1.5)
    s.scale_time(k, lead_in)
    # the first knot is the start of the episode: keep the arm at home during the lead-in
    s.arm_times[0] = 0.0
    s.grip_times[0] = 0.0
    s.grip_cmd[0] = (0.0, 0.0)
    s.steps[0] = (s.steps[0][0], 0.0)
    # the builder's 1 ms gaps between gripper knots may have become equal after scaling; fix
    gt = np.array(s.grip_times)
    for i in range(1, len(gt)):
        if gt[i] <= gt[i - 1]:
            gt[i] = gt[i - 1] + 1e-4
    s.grip_times = list(gt)
    return s


# --------------------------------------------------------------------------------------
# the arm over an episode
# --------------------------------------------------------------------------------------
@dataclass
class WorldState:
    """What the renderer needs at one instant."""

    t: float
    frames: np.ndarray  # (8, 4, 4) base, frame1..6, tcp
    opening: float
    objects: list[tuple[BoxObject, np.ndarray, float]]  # (object, centre xyz, yaw)
    drawer_offset: float = 0.0
    towel_edge: np.ndarray | None = None  # free-edge midpoint (3,) of the folding half
    stain_alpha: float = 1.0


def _ease(x):
    x = np.clip(x, 0.0, 1.0)
    return x * x * (3 - 2 * x)


class ScriptedArm:
    """Deterministic arm motion for one episode; all methods are pure functions of time."""

    LAG = 0.02  # measured follows the plan
    LEAD = 0.04  # action leads the plan

    def __init__(self, *, seed: int, task: str, robot_model: str, success: bool, duration_s: float):
        self.seed = seed
        self.arm = arm_model(robot_model)
        self.duration_s = float(duration_s)
        self.script = build_script(task, self.arm, seed, success, self.duration_s)
        s = self.script
        self.plan_arm = Quintic(s.arm_times, np.stack(s.arm_q))
        self.plan_grip = Quintic(s.grip_times, np.array(s.grip_open))
        rng = np.random.default_rng([seed, 102])
        # smooth tracking error: a few slow sinusoids per joint, amplitude ~1e-4 rad
        self._err_amp = rng.uniform(3e-5, 2.5e-4, size=(3, 6))
        self._err_w = 2 * math.pi * rng.uniform(0.3, 3.0, size=(3, 6))
        self._err_ph = rng.uniform(0, 2 * math.pi, size=(3, 6))
        self._grip_ts = np.array([t for t, _ in s.grip_cmd])
        self._grip_cs = np.array([c for _, c in s.grip_cmd])
        self._attach_cache: dict[int, np.ndarray] = {}

    # -- joint space ------------------------------------------------------------------
    def scripted_steps(self) -> list[dict]:
        """The procedure steps the script performed, in measured time (seconds from the episode
        start): ``{"name", "start_s", "end_s", "failed"}``; the last ends with the episode."""
        s = self.script
        starts = [0.0] + [t + self.LAG for _, t in s.steps[1:]]
        ends = starts[1:] + [self.duration_s]
        return [
            {"name": n, "start_s": a, "end_s": b, "failed": i == s.failed_step}
            for i, ((n, _), a, b) in enumerate(zip(s.steps, starts, ends))
        ]

    def q(self, t, deriv: int = 0) -> np.ndarray:
        """Measured (noise-free) joint positions (N, 7): 6 arm joints + gripper knuckle angle."""
        t = np.atleast_1d(np.asarray(t, dtype=np.float64))
        tp = t - self.LAG
        arm = self.plan_arm(tp, deriv)
        ph = self._err_w[None] * t[:, None, None] + self._err_ph[None]
        if deriv == 0:
            arm = arm + np.sum(self._err_amp[None] * np.sin(ph), axis=1)
        elif deriv == 1:
            arm = arm + np.sum(self._err_amp[None] * self._err_w[None] * np.cos(ph), axis=1)
        else:
            arm = arm - np.sum(self._err_amp[None] * self._err_w[None] ** 2 * np.sin(ph), axis=1)
        g = self.plan_grip(tp, deriv)
        gj = self.arm.opening_to_joint(g) if deriv == 0 else -self.arm.knuckle_max / self.arm.max_opening * g
        return np.concatenate([arm, gj], axis=1)

    def opening(self, t) -> np.ndarray:
        return self.plan_grip(np.atleast_1d(t) - self.LAG)[:, 0]

    def gripper_command(self, plan_t) -> np.ndarray:
        """The scripted gripper command (0 open, 1 close) in force at plan time ``plan_t``."""
        idx = np.searchsorted(self._grip_ts, np.atleast_1d(plan_t), side="right") - 1
        return self._grip_cs[np.clip(idx, 0, len(self._grip_cs) - 1)]

    def frames(self, t) -> np.ndarray:
        return fk_all(self.arm, self.q(t)[:, :6])

    def tcp(self, t) -> np.ndarray:
        return self.frames(t)[:, 7]

    # -- objects ------------------------------------------------------------------------
    def _measured(self, plan_t):
        return None if plan_t is None else plan_t + self.LAG

    def _held_offset(self, key: int, t_attach: float, obj_T: np.ndarray) -> np.ndarray:
        if key not in self._attach_cache:
            T = self.tcp(t_attach)[0]
            self._attach_cache[key] = np.linalg.inv(T) @ obj_T
        return self._attach_cache[key]

    def box_pose(self, obj: BoxObject, t: float) -> tuple[np.ndarray, float]:
        ta, td = self._measured(obj.attach_t), self._measured(obj.detach_t)
        pos0 = np.array(obj.pos, dtype=float)
        if ta is None or t < ta:
            return pos0, obj.yaw
        T0 = np.eye(4)
        T0[:3, :3] = np.array(
            [[math.cos(obj.yaw), -math.sin(obj.yaw), 0], [math.sin(obj.yaw), math.cos(obj.yaw), 0], [0, 0, 1]]
        )
        T0[:3, 3] = pos0
        off = self._held_offset(id(obj), ta, T0)

        def held(tt):
            T = self.tcp(tt)[0] @ off
            return T[:3, 3].copy(), yaw_of(T[:3, :3])

        if td is None or t < td:
            return held(t)
        p, yaw = held(td)
        rest = obj.size[2] / 2
        dt = t - td
        z = max(rest, p[2] - 0.5 * G * dt * dt)
        if obj.detach_kind == "slip":  # tumbles a little while falling
            yaw = yaw + 0.6 * _ease(dt / 0.3) * (1 if stable_hash(obj.name, self.seed) % 2 else -1)
        return np.array([p[0], p[1], z]), yaw

    def drawer_offset(self, t: float) -> float:
        cab = self.script.cabinet
        if cab is None or cab.attach_t is None:
            return 0.0
        ta, td = self._measured(cab.attach_t), self._measured(cab.detach_t)
        if t < ta:
            return 0.0
        p0 = self.tcp(ta)[0, :3, 3]
        p = self.tcp(min(t, td) if td is not None else t)[0, :3, 3]
        return float(np.clip(-(p[1] - p0[1]) * cab.side, 0.0, cab.drawer_max))

    def towel_edge(self, t: float) -> np.ndarray | None:
        tw = self.script.towel
        if tw is None:
            return None
        rest = np.array([tw.centre[0] + tw.length / 2, tw.centre[1], 0.003])
        ta, td = self._measured(tw.attach_t), self._measured(tw.detach_t)
        if ta is None or t < ta:
            return rest
        p0 = self.tcp(ta)[0, :3, 3]
        off = rest - p0

        def held(tt):
            return self.tcp(tt)[0, :3, 3] + off

        if td is None or t < td:
            e = held(t)
            e[2] = max(e[2], 0.003)
            return e
        p = held(td)
        if tw.detach_kind == "slip":  # flops back to where it lay
            return p + (rest - p) * _ease((t - td) / 0.45)
        target = np.array([p[0], p[1], 0.006])
        return p + (target - p) * _ease((t - td) / 0.25)

    def stain_alpha(self, t: float) -> float:
        st = self.script.stain
        if st is None or not st.effective or st.wipe_t0 is None:
            return 1.0
        a, b = self._measured(st.wipe_t0), self._measured(st.wipe_t1)
        return float(1.0 - 0.88 * _ease((t - a) / max(b - a, 1e-6)))

    def world_state(self, t: float) -> WorldState:
        fr = self.frames(t)[0]
        objs = [(o, *self.box_pose(o, t)) for o in self.script.objects]
        return WorldState(
            t, fr, float(self.opening(t)[0]), objs, self.drawer_offset(t), self.towel_edge(t), self.stain_alpha(t)
        )

    # -- streams ---------------------------------------------------------------------
    def _payload(self, t: np.ndarray) -> np.ndarray:
        m = np.zeros_like(t)
        for o in self.script.objects:
            if o.attach_t is None:
                continue
            ta = self._measured(o.attach_t)
            td = self._measured(o.detach_t) if o.detach_t is not None else np.inf
            m += np.where((t >= ta) & (t < td), o.mass, 0.0)
        tw = self.script.towel
        if tw is not None and tw.attach_t is not None:
            m += np.where((t >= self._measured(tw.attach_t)) & (t < self._measured(tw.detach_t)), 0.06, 0.0)
        return m

    def _holding(self, t: np.ndarray) -> np.ndarray:
        h = np.zeros(t.shape, dtype=bool)
        for o in [*self.script.objects, self.script.towel, self.script.cabinet]:
            if o is None or o.attach_t is None:
                continue
            td = self._measured(o.detach_t) if o.detach_t is not None else np.inf
            h |= (t >= self._measured(o.attach_t)) & (t < td)
        return h

    def effort(
        self, t: np.ndarray, q: np.ndarray, qd: np.ndarray, qdd: np.ndarray, rng: np.random.Generator
    ) -> np.ndarray:
        arm = self.arm
        fr = fk_all(arm, q[:, :6])
        o = fr[:, :, :3, 3]  # (N, 8, 3)
        z = fr[:, :, :3, 2]
        gvec = np.array([0.0, 0.0, -G])
        payload = self._payload(t)
        # point masses: link k at the midpoint of o_{k-1}..o_k; tool at the flange; payload at the tcp
        masses = [(0.5 * (o[:, k - 1] + o[:, k]), np.full(len(t), arm.link_mass[k - 1]), k) for k in range(1, 7)]
        tool_c = o[:, 6] + 0.06 * z[:, 6]
        masses.append((tool_c, np.full(len(t), arm.tool_mass), 6))
        masses.append((o[:, 7], payload, 6))
        tau = np.zeros((len(t), 7))
        for j in range(1, 7):
            axis, origin = z[:, j - 1], o[:, j - 1]
            acc = np.zeros((len(t), 3))
            for c, m, k in masses:
                if k >= j:
                    acc += np.cross(c - origin, m[:, None] * gvec[None, :])
            tau[:, j - 1] = -np.einsum("ij,ij->i", axis, acc)  # motor torque holding against gravity
        inertia = np.array(arm.joint_inertia)
        tau[:, :6] += inertia * qdd[:, :6] + 2.5 * qd[:, :6] + 1.2 * np.tanh(qd[:, :6] / 0.02)
        tau[:, :6] += rng.normal(0.0, 0.08, size=(len(t), 6)) * np.array([1.5, 1.5, 1.0, 0.5, 0.5, 0.4])
        # gripper effort: grip force (N) while holding something or squeezed shut, else ~0
        closed = self.gripper_command(t - self.LAG) > 0.5
        grip = np.where(closed, np.where(self._holding(t), 35.0, 12.0), 0.0)
        grip += 40.0 * np.abs(qd[:, 6])
        tau[:, 6] = grip + rng.normal(0.0, 0.3, size=len(t))
        return tau

    def wrench(self, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        fr = fk_all(self.arm, self.q(t)[:, :6])
        R = fr[:, 6, :3, :3]  # sensor at the flange
        n = len(t)
        F = np.zeros((n, 3))
        F[:, 2] -= G * (self.arm.tool_mass + self._payload(t))
        s = self.script
        for t0, t1, normal in s.press:
            a, b = self._measured(t0), self._measured(t1)
            ramp = _ease((t - a) / 0.15) * (1 - _ease((t - b) / 0.15))
            F[:, 2] += normal * ramp * (1 + 0.08 * np.sin(2 * math.pi * 7.0 * t))
            # friction against the wiping direction
            h = 1e-3
            v = (fk_all(self.arm, self.q(t + h)[:, :6])[:, 7, :3, 3] - fr[:, 7, :3, 3]) / h
            sp = np.linalg.norm(v[:, :2], axis=1, keepdims=True)
            F[:, :2] -= 0.5 * normal * ramp[:, None] * v[:, :2] / np.maximum(sp, 0.02)
        for t0, t1, vec in s.pull:
            a, b = self._measured(t0), self._measured(t1)
            ramp = _ease((t - a) / 0.1) * (1 - _ease((t - b) / 0.05))
            F += ramp[:, None] * np.array(vec)[None, :]
        for ti, mag, d in s.impulses:
            x = t - self._measured(ti)
            pulse = np.where(x >= 0, np.exp(-np.maximum(x, 0) / 0.035) * np.cos(2 * math.pi * 18.0 * x), 0.0)
            F += mag * pulse[:, None] * np.array(d)[None, :]
        Fs = np.einsum("nji,nj->ni", R, F)  # R^T F: world -> sensor frame
        r = np.array([0.002, -0.001, 0.07])  # where the load acts, sensor frame
        Ts = np.cross(r[None, :], Fs)
        bias = np.random.default_rng([self.seed, 103]).normal(0, [1.5, 1.5, 2.5, 0.05, 0.05, 0.03])
        w = np.concatenate([Fs, Ts], axis=1) + bias
        w += rng.normal(0.0, 1.0, size=(n, 6)) * np.array([0.12, 0.12, 0.18, 0.004, 0.004, 0.003])
        return w

    def imu(self, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        h = 1e-3
        T_m, T_0, T_p = (fk_all(self.arm, self.q(t + d)[:, :6])[:, 6] for d in (-h, 0.0, h))
        p_dd = (T_p[:, :3, 3] - 2 * T_0[:, :3, 3] + T_m[:, :3, 3]) / (h * h)
        R = T_0[:, :3, :3]
        # body angular velocity from R^T dR/dt (skew)
        dR = (T_p[:, :3, :3] - T_m[:, :3, :3]) / (2 * h)
        W = np.einsum("nji,njk->nik", R, dR)
        gyro = np.stack([W[:, 2, 1] - W[:, 1, 2], W[:, 0, 2] - W[:, 2, 0], W[:, 1, 0] - W[:, 0, 1]], axis=1) / 2
        spec = p_dd + np.array([0.0, 0.0, G])[None, :]
        acc = np.einsum("nji,nj->ni", R, spec)
        brng = np.random.default_rng([self.seed, 104])
        acc += brng.normal(0, 0.04, 3)[None, :] + rng.normal(0, 0.035, size=acc.shape)
        gyro += brng.normal(0, 0.003, 3)[None, :] + rng.normal(0, 0.0025, size=gyro.shape)
        speed = np.linalg.norm(self.q(t, 1)[:, :6], axis=1)  # motor vibration while moving
        acc += (0.05 * speed)[:, None] * rng.normal(0, 1.0, size=acc.shape)
        return np.concatenate([acc, gyro], axis=1)

    def streams(self, start_ns: int, *, proprio_hz: float = 200.0, action_hz: float = 50.0) -> dict[str, SampleStream]:
        rng = np.random.default_rng([self.seed, 105])
        d = self.duration_s
        ctrl_ts = make_timestamps(rng, start_ns, proprio_hz, d, offset_ms=rng.uniform(1.0, 8.0))
        sens_ts = make_timestamps(rng, start_ns, proprio_hz, d, offset_ms=rng.uniform(1.0, 8.0))
        imu_ts = make_timestamps(rng, start_ns, proprio_hz, d, offset_ms=rng.uniform(1.0, 8.0))
        act_ts = make_timestamps(rng, start_ns, action_hz, d, offset_ms=rng.uniform(0.5, 5.0))
        tc = (ctrl_ts - start_ns) / 1e9
        q, qd, qdd = self.q(tc), self.q(tc, 1), self.q(tc, 2)
        pos = q + rng.normal(0, 4e-6, size=q.shape)
        vel = qd + rng.normal(0, 1.5e-3, size=qd.shape)
        eff = self.effort(tc, q, qd, qdd, rng)
        fr = fk_all(self.arm, q[:, :6])[:, 7]
        quat = rot_to_quat(fr[:, :3, :3])
        ee = np.concatenate([fr[:, :3, 3] + rng.normal(0, 2e-5, size=(len(tc), 3)), quat], axis=1)
        opening = np.clip(self.opening(tc) + rng.normal(0, 5e-5, size=len(tc)), 0.0, self.arm.max_opening)
        ts_s = (sens_ts - start_ns) / 1e9
        ti = (imu_ts - start_ns) / 1e9
        ta = (act_ts - start_ns) / 1e9
        cmd = self.plan_arm(ta + self.LEAD)
        grip_cmd = self.gripper_command(ta + self.LEAD).astype(np.float64)
        grip_target = np.where(grip_cmd > 0.5, self.arm.knuckle_max, 0.0)
        action = np.concatenate([cmd, grip_target[:, None], grip_cmd[:, None]], axis=1)
        lab = {"position": JOINT_LABELS, "velocity": JOINT_LABELS, "effort": JOINT_LABELS}
        return {
            "joint_states": SampleStream(
                "joint_states",
                ctrl_ts,
                {"position": pos, "velocity": vel, "effort": eff},
                {k: list(v) for k, v in lab.items()},
            ),
            "ee_pose": SampleStream(
                "ee_pose", ctrl_ts.copy(), {"pose": ee}, {"pose": ["x", "y", "z", "qx", "qy", "qz", "qw"]}
            ),
            "gripper": SampleStream(
                "gripper", ctrl_ts.copy(), {"position": opening[:, None]}, {"position": ["opening_m"]}
            ),
            "wrench": SampleStream(
                "wrench",
                sens_ts,
                {"force_torque": self.wrench(ts_s, rng)},
                {"force_torque": ["fx", "fy", "fz", "tx", "ty", "tz"]},
            ),
            "imu": SampleStream(
                "imu", imu_ts, {"accel_gyro": self.imu(ti, rng)}, {"accel_gyro": ["ax", "ay", "az", "gx", "gy", "gz"]}
            ),
            "action": SampleStream("action", act_ts, {"command": action}, {"command": list(ACTION_LABELS)}),
        }


def make_timestamps(
    rng: np.random.Generator,
    start_ns: int,
    hz: float,
    duration_s: float,
    *,
    offset_ms: float = 0.0,
    jitter_ms: float = 0.06,
    max_jitter_ms: float = 0.2,
) -> np.ndarray:
    """int64 ns: start + offset + k/hz + clipped Gaussian jitter; strictly increasing by construction
    (jitter is far below half a period)."""
    n = max(int(math.floor(duration_s * hz + 1e-9)), 1)
    period = 1e9 / hz
    jitter = np.clip(rng.normal(0.0, jitter_ms, size=n), -max_jitter_ms, max_jitter_ms) * 1e6
    jitter = np.clip(jitter, -0.45 * period, 0.45 * period)
    ts = start_ns + int(round(offset_ms * 1e6)) + np.round(np.arange(n) * period + jitter).astype(np.int64)
    return ts.astype(np.int64)
