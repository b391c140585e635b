"""An example agent the approval console runs, registered through the approvals.agents entry point.

AGENTS is what the entry point names: version -> entry, the same shape as an entry of the
console's APPROVALS_AGENTS setting.
"""

from __future__ import annotations

AGENTS = {
    "1": {"factory": "release_agent.agent.build_agent"},
}
