"""Resource presets ("CPU small", "half GPU"): named slots that admins define, shown beside the
custom sliders of the launch dialog and the spawn form, and taken by `preset` in a launch.

Site-wide ones come from `QueueService.presets` (jupyterhub_config.py: FGPU_PRESETS); a hub group
adds its own in its properties, as `fgpu_presets`, which admins edit in the admin panel like the
group's quota (quotas.py):

    [{"name": "half GPU", "cpu": 2, "mem": "8G", "fgpu": 1}]

A group's preset is offered to its members only; one of the same name as a site preset replaces it
for them. A preset bigger than the user's quota, or than one session may have, is listed with the
reason and refused in a launch: a preset is a shortcut, never a way around a limit. Pure, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fgpu_shared.units import format_size, parse_size

PRESETS_PROPERTY = "fgpu_presets"
_KEYS = {"name", "cpu", "mem", "fgpu"}
NAME_MAX = 40


class PresetError(ValueError):
    pass


@dataclass(frozen=True)
class Preset:
    name: str
    cpu: float
    mem: int
    fgpu: float = 0.0


def parse_presets(data: object, where: str) -> tuple[Preset, ...]:
    """A list of preset mappings → Presets; PresetError naming `where` and the preset."""
    if data is None:
        return ()
    if not isinstance(data, list):
        raise PresetError(f"{where}: presets must be a list of mappings")
    presets = [_parse_one(item, f"{where}, preset {i + 1}") for i, item in enumerate(data)]
    names = [p.name for p in presets]
    doubled = sorted({n for n in names if names.count(n) > 1})
    if doubled:
        raise PresetError(f"{where}: preset name(s) given twice: {', '.join(doubled)}")
    return tuple(presets)


def _parse_one(item: object, where: str) -> Preset:
    if not isinstance(item, dict):
        raise PresetError(f"{where}: must be a mapping with name, cpu, mem and fgpu")
    unknown = sorted(set(item) - _KEYS)
    if unknown:
        raise PresetError(f"{where}: unknown key(s) {', '.join(unknown)}")
    name = item.get("name")
    if not isinstance(name, str) or not name.strip() or len(name.strip()) > NAME_MAX:
        raise PresetError(f"{where}: name must be text of 1 to {NAME_MAX} characters")
    try:
        cpu, fgpu = _amount(item.get("cpu")), _amount(item.get("fgpu", 0))
        mem = parse_size(item.get("mem"))
    except (TypeError, ValueError, OverflowError) as e:
        raise PresetError(f"{where} ({name}): {e}") from None
    if cpu <= 0 or mem <= 0:
        raise PresetError(f"{where} ({name}): cpu and mem must be above zero")
    return Preset(name.strip(), cpu, mem, fgpu)


def _amount(value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{value!r} is not a number")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{value!r} is not an amount (a finite number, zero or more)")
    return number


def merged(site: tuple[Preset, ...], by_group: dict[str, tuple[Preset, ...]]) -> list[Preset]:
    """The presets for a member of these groups: the site's, then each group's (in name order),
    a later one of the same name replacing the earlier."""
    chosen: dict[str, Preset] = {p.name: p for p in site}
    for group in sorted(by_group):
        for preset in by_group[group]:
            chosen.pop(preset.name, None)
            chosen[preset.name] = preset
    return list(chosen.values())


_SHOW = {
    "cpu": lambda v: f"{v:g} cores",
    "mem": lambda v: format_size(int(v)),
    "fgpu": lambda v: f"{v:g} fGPU",
}


def refusal(preset: Preset, quota: dict, session_max: dict) -> str | None:
    """Why this user may not launch `preset`, or None. `quota`: the tightest cpu/mem/fgpu totals
    of the user's quotas (None: no limit); `session_max`: the most one session may have."""
    for key in ("cpu", "mem", "fgpu"):
        asked, show = getattr(preset, key), _SHOW[key]
        most = session_max.get(key)
        if most is not None and asked > most + 1e-9:
            if key == "fgpu" and most <= 0:
                return "This hub offers no fGPU."
            return f"Needs {show(asked)}; one session may have at most {show(most)}."
        allowed = quota.get(key)
        if allowed is not None and asked > allowed + 1e-9:
            return f"Needs {show(asked)}; your quota allows {show(allowed)} in all."
    return None


def listing(presets: list[Preset], quota: dict, session_max: dict) -> list[dict]:
    """`GET api/presets`'s answer: each preset's slots and whether the user may pick it now."""
    rows = []
    for preset in presets:
        why = refusal(preset, quota, session_max)
        rows.append(
            {
                "name": preset.name,
                "cpu": preset.cpu,
                "mem": preset.mem,
                "fgpu": preset.fgpu,
                "available": why is None,
                "reason": why or "",
            }
        )
    return rows
