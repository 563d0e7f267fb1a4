# distplan_embed_json(<target> <namespace> <out_var> FILES...) writes a C++ source that holds each
# file's text as a raw string literal in a sorted table {relative path, text}, so presets ship inside
# the binary and the files in data/ stay the one source of truth.
function(distplan_embed_files out_cpp symbol)
  set(body "// Generated from data/ by cmake/EmbedData.cmake. Do not edit.\n#include <string_view>\n#include <utility>\n#include <span>\n\nnamespace distplan::data {\nnamespace {\nconstexpr std::pair<std::string_view, std::string_view> k${symbol}[] = {\n")
  set(files ${ARGN})
  list(SORT files)
  foreach(f ${files})
    file(READ ${f} text)
    file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR}/data ${f})
    string(APPEND body "  {\"${rel}\", R\"distplan_data(${text})distplan_data\"},\n")
    set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${f})
  endforeach()
  string(APPEND body "};\n}  // namespace\n\nstd::span<const std::pair<std::string_view, std::string_view>> ${symbol}() { return k${symbol}; }\n}  // namespace distplan::data\n")
  file(WRITE ${out_cpp}.tmp "${body}")
  configure_file(${out_cpp}.tmp ${out_cpp} COPYONLY)
endfunction()
