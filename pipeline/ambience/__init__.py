"""The ambience stage's machinery: which recordings of an ambience library become background segments."""
