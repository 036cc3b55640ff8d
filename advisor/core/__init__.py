"""core layer"""
