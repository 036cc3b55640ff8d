"""configs layer"""
