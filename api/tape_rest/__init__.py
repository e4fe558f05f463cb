"""The WLCG Tape REST API v1, served by Carousel (the grid's door beside the native API)."""
