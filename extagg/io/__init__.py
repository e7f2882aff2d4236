"""extagg.io"""
