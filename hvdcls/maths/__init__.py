"""The shared maths: what both backends compute alike, written once with a numpy reference that
the backends' tests compare against: PowerSGD's compression and its byte counts (powersgd),
LARS's and LAMB's trust ratios (lars_lamb), ZeRO's flat buckets and each rank's slice (zero).
Part of the core: no framework."""
