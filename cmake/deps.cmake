# Finds the design card's host libraries. Each missing one stops configuration with the Debian
# package that provides it. With STRATA_STATIC_DEPS the static archives are preferred, so the
# binaries run on machines that lack the shared objects (the GPU machine has no liburing/jemalloc).

find_package(OpenMP REQUIRED COMPONENTS C)
find_package(Threads REQUIRED)

# strata_find_lib(<target> <header> <static name> <shared name> <debian package> [extra libs...])
function(strata_find_lib target header static_name shared_name pkg)
  find_path(${target}_INCLUDE ${header})
  if(STRATA_STATIC_DEPS)
    find_library(${target}_LIB NAMES ${static_name} ${shared_name})
  else()
    find_library(${target}_LIB NAMES ${shared_name} ${static_name})
  endif()
  if(NOT ${target}_INCLUDE OR NOT ${target}_LIB)
    message(FATAL_ERROR "strata needs ${shared_name} (${header}). Install it with: "
                        "sudo apt-get install ${pkg}   (or run ./scripts/build.sh, which installs "
                        "missing Debian packages)")
  endif()
  add_library(strata::${target} INTERFACE IMPORTED GLOBAL)
  target_include_directories(strata::${target} INTERFACE ${${target}_INCLUDE})
  target_link_libraries(strata::${target} INTERFACE ${${target}_LIB} ${ARGN})
  message(STATUS "strata: ${target} -> ${${target}_LIB}")
endfunction()

strata_find_lib(hwloc hwloc.h libhwloc.a hwloc libhwloc-dev udev m Threads::Threads)
strata_find_lib(uring liburing.h liburing.a uring liburing-dev)
strata_find_lib(jemalloc jemalloc/jemalloc.h libjemalloc_pic.a jemalloc libjemalloc-dev
                Threads::Threads dl m)
strata_find_lib(jsonc json-c/json.h libjson-c.a json-c libjson-c-dev)
strata_find_lib(pcre2 pcre2.h libpcre2-8.a pcre2-8 libpcre2-dev)
target_compile_definitions(strata::pcre2 INTERFACE PCRE2_CODE_UNIT_WIDTH=8 PCRE2_STATIC)
strata_find_lib(xxhash xxhash.h libxxhash.a xxhash libxxhash-dev)
strata_find_lib(microhttpd microhttpd.h libmicrohttpd.a microhttpd libmicrohttpd-dev gnutls
                Threads::Threads)
strata_find_lib(utf8proc utf8proc.h libutf8proc.a utf8proc libutf8proc-dev)
target_compile_definitions(strata::utf8proc INTERFACE UTF8PROC_STATIC)

# strata_module(<name> <folder> [deps...]): the static library strata_<name> of <folder>'s .c
# files (and subfolders given as extra globs by the caller); its headers are visible to the
# modules that link it, never to those below it, so an include that runs upward fails to build.
function(strata_module name folder)
  file(GLOB srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${folder}/*.c)
  add_library(strata_${name} STATIC ${srcs})
  target_include_directories(strata_${name} PUBLIC ${PROJECT_SOURCE_DIR}/${folder})
  target_link_libraries(strata_${name} PUBLIC ${ARGN})
endfunction()
