"""extagg.spark"""
