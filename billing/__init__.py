"""Money: the price map (versioned, per model glob and upstream), the cost of an attempt, spend reports.

``billing.cost`` is pure (usage and a price in, USD out); ``billing.book`` holds the prices a serving
process charges with (ORM-free, cached, refreshed off the request path); ``billing.models`` the
operator's prices; ``billing/prices.json`` the shipped defaults, each with its date and public source.
"""
