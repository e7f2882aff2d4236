"""extagg.aggregate"""
