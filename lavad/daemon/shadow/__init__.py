"""Shadow mode: lavad beside an existing scheduler, measured on the same requests.

The actual cluster follows the existing scheduler (its ``vm.placed`` events
and the exits); beside it a counterfactual pool places the same requests
with lavad's configured policy and sees the same exits. Both are measured
with the same metrics, and lavad's decisions are advice, published on a
shadow topic, never as placements.
"""
