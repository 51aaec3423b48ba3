"""Source patches (rig's patch set, rig/patches/set/*.yml) on an installed environment: status, apply, revert.

A patch names its package, the versions that need it and the versions whose
upstream already has it, the file, and hunks anchored on the exact code they
expect: an anchor that is not found once is drift, and nothing is written.
A patch may be opt-in (its `opt_in` names a feature, e.g. free-off): it is
applied only where the feature is asked for (a stack's patches.opt_in, or
--opt-in), and an apply without the feature takes it out again.

The steps, one module each:

    patchset     the patch files, read strictly; the opt-in features they offer
    env          the environment: its Python, the installed versions, rig's record of what it patched there
    hunks        one patch's hunks on one file's text: applied, needed or drifted
    report       each patch's status (a row), and the rows as a table
    plan         what apply or revert would change, decided whole, refused before anything is written
    verify       the patched code compiled and each patch's check run, in the environment's own Python
    transaction  a plan written: originals backed up and recorded first, everything put back on a failure
    actions      apply and revert: a plan, shown (--check) or written

Nothing is re-exported here: each caller imports the step it uses.
"""
