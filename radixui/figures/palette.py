"""One palette for the radix tree, its legend and the overview: the LMSYS RadixAttention colours."""

FILL = {
    "root": "#1f2937",
    "cached": "#ffffff",
    "inserted": "#2e9d48",   # green: inserted this step
    "matched": "#2f7fd8",    # blue: matched this step
    "locked": "#9ca3af",     # grey: locked by a running request
    "collapsed": "#e5e7eb",
    "evicted": "#fecaca",    # pale red ghost: evicted in the last few steps, fading
}
# the overview's boxes: pale fills under dark text (contrast >= 4.5, checked by the tests)
OVERVIEW_FILL = {"root": "#f3f4f6", "cached": "#dbeafe", "evictable": "#fee2e2", "inserted": "#bbf7d0",
                 "matched": "#bfdbfe", "locked": "#e5e7eb"}
OVERVIEW_TEXT = "#111827"
OUTLINE = "#374151"
EVICTABLE_OUTLINE = "#dc2626"  # red: evictable leaf
GHOST_OUTLINE = "#dc2626"
SPLIT_RING = "#6d28d9"
VICTIM = "#dc2626"
EDGE = "#9ca3af"
LEGEND_NAMES = {
    "inserted": "inserted (this step)",
    "matched": "matched (this step)",
    "locked": "locked",
    "cached": "cached",
    "collapsed": "collapsed subtrees (+N)",
    "evicted": "evicted (fading)",
}
STATE_ORDER = ("inserted", "matched", "locked", "cached")
# the Capacity lab's routings: hues far apart (the Streamlit theme's default colourway gave
# round_robin and cache_aware a red and a pale red)
ROUTING_COLOURS = {"round_robin": "#d97706", "cache_aware": "#2563eb", "prefix_hash": "#059669",
                   "least_load": "#7c3aed"}
