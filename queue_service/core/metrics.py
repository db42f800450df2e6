"""`/services/queue/metrics`: allocations, live usage and the queue in Prometheus' text format.

Who may read it: hub admins (cookie or token), and any token whose scopes include JupyterHub's
`read:metrics` together with `access:services!service=queue` (the second lets the token reach the
service at all). A Prometheus scraper gets such a token as a hub service, for example:

    c.JupyterHub.services.append({"name": "prometheus", "api_token": "<secret>"})
    c.JupyterHub.load_roles.append({"name": "metrics", "services": ["prometheus"],
        "scopes": ["read:metrics", "access:services!service=queue"]})

The page is built from what the service already holds (its DB and the stats sampler's last
round), so a scrape never reaches the Docker engine. `render` is pure; the handler is in
`handlers/resources.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Statuses counted in the queue-length gauge: the ones a record can still leave.
QUEUE_STATUSES = ("PENDING", "SCHEDULED", "RUNNING")

# (metric, help, the session's key, the usage's key); a None value is left out, not written 0.
_SESSION_GAUGES = (
    ("fgpu_session_allocated_cpu_cores", "CPU cores the session asked for", "cpu", None),
    ("fgpu_session_allocated_mem_bytes", "Memory the session asked for", "mem", None),
    ("fgpu_session_allocated_fgpu", "fGPU units the session asked for", "fgpu", None),
    (
        "fgpu_session_cpu_percent",
        "CPU use over the last interval (100 = one core)",
        None,
        "cpu_percent",
    ),
    ("fgpu_session_mem_bytes", "Memory in use, as docker stats counts it", None, "mem_bytes"),
    ("fgpu_session_mem_limit_bytes", "The container's memory limit", None, "mem_limit_bytes"),
    ("fgpu_session_gpu_mem_bytes", "GPU memory its processes use (NVML)", None, "gpu_mem_bytes"),
    (
        "fgpu_session_gpu_util_percent",
        "SM utilisation of its processes (NVML)",
        None,
        "gpu_util_percent",
    ),
)


def escape(value: str) -> str:
    """A label value as the text format wants it: backslash, quote and newline escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: Mapping[str, str]) -> str:
    return "{" + ",".join(f'{key}="{escape(value)}"' for key, value in pairs.items()) + "}"


def _family(name: str, help_text: str, samples: Iterable[tuple[Mapping[str, str], float]]):
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    lines += [f"{name}{_labels(labels)} {float(value)!r}" for labels, value in samples]
    return lines


def render(sessions: list[dict], nodes: list[dict], units_per_gpu: float) -> str:
    """The metrics page: per-session allocation and usage (sessions holding a slice), per-GPU
    allocated share and capacity, and how many records wait, hold a grant, or run."""
    lines: list[str] = []
    holding = [s for s in sessions if s["status"] in ("SCHEDULED", "RUNNING")]
    for name, help_text, key, usage_key in _SESSION_GAUGES:
        samples = []
        for session in holding:
            labels = {
                "session": session["id"],
                "user": session["user"],
                "server": session["server_name"],
            }
            value = session[key] if key else (session.get("usage") or {}).get(usage_key)
            if value is not None:
                samples.append((labels, value))
        lines += _family(name, help_text, samples)
    gpus = [(node, gpu) for node in nodes for gpu in node["gpus"]]

    def gpu_labels(node, gpu):
        return {"node": node["name"], "gpu": gpu["uuid"], "index": str(gpu["index"])}

    lines += _family(
        "fgpu_gpu_allocated_fraction",
        "Share of the GPU granted to sessions (0 to 1)",
        [(gpu_labels(n, g), round(1 - g["fraction_free"], 6)) for n, g in gpus],
    )
    lines += _family(
        "fgpu_gpu_capacity_fgpu",
        "fGPU units the GPU holds (units_per_gpu)",
        [(gpu_labels(n, g), units_per_gpu) for n, g in gpus],
    )
    lines += _family(
        "fgpu_gpu_allocated_fgpu",
        "fGPU units of the GPU granted to sessions",
        [(gpu_labels(n, g), round(units_per_gpu - g["fgpu_free"], 6)) for n, g in gpus],
    )
    counts = {status: 0 for status in QUEUE_STATUSES}
    for session in sessions:
        if session["status"] in counts:
            counts[session["status"]] += 1
    lines += _family(
        "fgpu_queue_sessions",
        "Session records by status",
        [({"status": status}, count) for status, count in counts.items()],
    )
    return "\n".join(lines) + "\n"
