"""One palette for the radix tree, its legend and the overview: the LMSYS RadixAttention colours."""

FILL = {
    "root": "#1f2937",
    "cached": "#ffffff",
    "inserted": "#2e9d48",   # green: inserted this step
    "matched": "#2f7fd8",    # blue: matched this step
    "locked": "#9ca3af",     # grey: locked by a running request
    "collapsed": "#e5e7eb",
}
OVERVIEW_FILL = {"root": "#e5e7eb", "cached": "#dbe4f0", "evictable": "#f8d4d4"}
OUTLINE = "#374151"
EVICTABLE_OUTLINE = "#dc2626"  # red: evictable leaf
SPLIT_RING = "#6d28d9"
VICTIM = "#dc2626"
EDGE = "#9ca3af"
LEGEND_NAMES = {
    "inserted": "inserted (this step)",
    "matched": "matched (this step)",
    "locked": "locked",
    "cached": "cached",
    "collapsed": "collapsed subtrees (+N)",
}
STATE_ORDER = ("inserted", "matched", "locked", "cached")
