"""extagg.collection"""
