"""extagg.spill"""
