"""extagg.merge: the external heap merge shared by both engines."""
