"""extagg.state"""
