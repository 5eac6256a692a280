/* libbhtestdep.so: a library that the origin_* test plugins link and find beside them through
 * $ORIGIN in their RUNPATH or RPATH, as a connector that bundles its own libraries does. */
__attribute__((visibility("default"))) int backhaul_test_dep_answer(void) { return 42; }
