"""extagg.memory"""
