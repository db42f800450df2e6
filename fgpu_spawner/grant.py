"""A grant: the slice of one node that a session may use (docs/source/explanation/architecture.md, "The resource model").

The queue service issues grants; the spawner only reads them. `gpus` maps a GPU UUID to the fraction
of that GPU granted, so a grant for 1.5 GPUs reads {"GPU-a": 1.0, "GPU-b": 0.5}.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Grant:
    session_id: str
    node: str
    gpus: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"session_id": self.session_id, "node": self.node, "gpus": self.gpus})

    @classmethod
    def from_json(cls, text: str) -> Grant:
        data = json.loads(text)
        return cls(data["session_id"], data["node"], dict(data.get("gpus") or {}))
