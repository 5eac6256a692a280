# backhaul_embed_migrations(<out_cpp> <backend> <dir>)
#
# Generates <out_cpp> defining
#   const std::vector<backhaul::jobs::Migration>& backhaul::jobs::<backend>_migrations();
# from every NNNN_name.sql in <dir> (sorted; NNNN is the version), so installed binaries carry
# their schema. Re-runs when a migration file changes or is added (configure-time glob).
function(backhaul_embed_migrations out_cpp backend dir)
  file(GLOB _files CONFIGURE_DEPENDS "${dir}/*.sql")
  list(SORT _files)
  set(_body "")
  foreach(_file IN LISTS _files)
    get_filename_component(_name "${_file}" NAME_WE)
    string(REGEX MATCH "^[0-9]+" _version "${_name}")
    if(NOT _version)
      message(FATAL_ERROR "migration ${_file} must start with its version number")
    endif()
    math(EXPR _version "${_version} + 0")
    file(READ "${_file}" _sql)
    # Re-configure when the file's contents change too, not only when files are added.
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${_file}")
    string(APPEND _body "    {${_version}, \"${_name}\", R\"__sql__(${_sql})__sql__\"},\n")
  endforeach()
  file(CONFIGURE OUTPUT "${out_cpp}" CONTENT
"// Generated from ${dir} by cmake/BackhaulEmbed.cmake. Do not edit.
#include \"core/jobs/migrations.h\"

namespace backhaul::jobs {

const std::vector<Migration>& ${backend}_migrations() {
  static const std::vector<Migration> migrations = {
${_body}  };
  return migrations;
}

}  // namespace backhaul::jobs
")
endfunction()
