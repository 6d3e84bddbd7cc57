"""Dataset pipeline: source corpora, event clipping, ambience segmentation and the stages after them."""
