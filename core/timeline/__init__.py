"""The job's timeline: every tensor's journey across all processes (docs/guide/timeline.md).

``recorder`` records one process's share, ``merge`` joins the shares into one Chrome
trace / Perfetto JSON file, ``summarize`` analyses it (``python -m fastps.timeline``).
"""
