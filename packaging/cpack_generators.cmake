# Read by cpack once per generator (CPACK_PROJECT_CONFIG_FILE).
if(CPACK_GENERATOR STREQUAL "TGZ")
  # One archive holding every packaged component (not one per component).
  set(CPACK_ARCHIVE_COMPONENT_INSTALL ON)
  set(CPACK_COMPONENTS_GROUPING ALL_COMPONENTS_IN_ONE)
  set(CPACK_COMPONENT_INCLUDE_TOPLEVEL_DIRECTORY ON)  # backhaul-<version>-Linux/bin/..., no tarbomb
endif()
if(CPACK_GENERATOR STREQUAL "DEB")
  # Each package's synopsis is the first line of its CPACK_DEBIAN_<COMPONENT>_DESCRIPTION; CPack
  # would put the project's summary above it unless the summary is CPack's default.
  set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${CPACK_DEFAULT_PACKAGE_DESCRIPTION_SUMMARY}")
endif()
