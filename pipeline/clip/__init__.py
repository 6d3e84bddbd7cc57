"""The clip stage's machinery: which FSD50K clips qualify, cutting one, and the picture of how clips were cut."""
