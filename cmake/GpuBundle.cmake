# Building against a GPU bundle (.gpu/ from scripts/gpu-bundle.sh) on a machine that has a
# compiler, CMake and a PyTorch install but none of our C++ dependencies: their headers, CMake
# configs and libraries come from the bundle, the API sources are the bundle's generated ones,
# and only the trainer, its unit tests and the GPU tests are built (the coordinator, agent and
# CLI travel prebuilt in the bundle's bin/).
if(NOT EXISTS "${TRAINYARD_GPU_BUNDLE}/MANIFEST.txt")
  message(FATAL_ERROR "TRAINYARD_GPU_BUNDLE=${TRAINYARD_GPU_BUNDLE} is not a bundle "
    "(no MANIFEST.txt): run make gpu-bundle")
endif()
get_filename_component(TRAINYARD_GPU_BUNDLE "${TRAINYARD_GPU_BUNDLE}" ABSOLUTE)
set(bundle_usr "${TRAINYARD_GPU_BUNDLE}/usr")
set(bundle_libdir "${bundle_usr}/lib/x86_64-linux-gnu")
list(PREPEND CMAKE_PREFIX_PATH "${bundle_usr}")
# The bundle's configs, never a system copy of another version.
set(absl_DIR "${bundle_libdir}/cmake/absl")
set(gRPC_DIR "${bundle_libdir}/cmake/grpc")
set(yaml-cpp_DIR "${bundle_libdir}/cmake/yaml-cpp")
set(GTest_DIR "${bundle_libdir}/cmake/GTest")
set(Gloo_DIR "${bundle_usr}/share/cmake/Gloo")
set(nlohmann_json_DIR "${bundle_usr}/share/cmake/nlohmann_json")
set(Protobuf_INCLUDE_DIR "${bundle_usr}/include")
set(Protobuf_LIBRARY "${bundle_libdir}/libprotobuf.so")
set(OPENSSL_ROOT_DIR "${bundle_usr}")
set(OPENSSL_INCLUDE_DIR "${bundle_usr}/include")
set(OPENSSL_CRYPTO_LIBRARY "${bundle_libdir}/libcrypto.so")
set(OPENSSL_SSL_LIBRARY "${bundle_libdir}/libssl.so")
set(CURL_INCLUDE_DIR "${bundle_usr}/include")
set(CURL_LIBRARY "${bundle_libdir}/libcurl.so")
set(ZLIB_INCLUDE_DIR "${bundle_usr}/include")
set(ZLIB_LIBRARY "${bundle_libdir}/libz.so")
set(TRAINYARD_PROTO_GEN_DIR "${TRAINYARD_GPU_BUNDLE}/gen")
set(TRAINYARD_TRAINER_ONLY ON)
# The bundle's libraries find one another through their own RUNPATH ($ORIGIN); what we build
# here finds them through its own, in the build tree.
list(APPEND CMAKE_BUILD_RPATH "${bundle_libdir}" "${bundle_usr}/lib")
message(STATUS "GPU bundle: ${TRAINYARD_GPU_BUNDLE}")
# gRPC's config finds RE2 through pkg-config, which a bare machine lacks: RE2 from the bundle,
# as the target gRPC's config would have made.
if(NOT TARGET re2::re2)
  add_library(re2::re2 SHARED IMPORTED)
  set_target_properties(re2::re2 PROPERTIES
    IMPORTED_LOCATION "${bundle_libdir}/libre2.so"
    INTERFACE_INCLUDE_DIRECTORIES "${bundle_usr}/include")
  set(re2_FOUND TRUE)
endif()
# Debian's multiarch headers (openssl/opensslconf.h, curl's): a compiler searches only its own
# system's /usr/include/ARCH.
include_directories(SYSTEM "${bundle_usr}/include/x86_64-linux-gnu")

# A process loads one libgloo.so.0. Where the machine's own LibTorch needs one (Debian's does; a
# pip install of PyTorch does not), the trainer must load that same copy, with the libraries it
# brings (its OpenSSL, say), not the bundle's, or the two clash at run time.
function(trainyard_bundle_gloo_library)
  find_library(TRAINYARD_MACHINE_GLOO NAMES libgloo.so.0
    PATHS /usr/lib /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu NO_DEFAULT_PATH)
  get_filename_component(torch_lib_dir "${TORCH_LIBRARY}" DIRECTORY)
  set(torch_cpu "${torch_lib_dir}/libtorch_cpu.so")
  if(TRAINYARD_MACHINE_GLOO AND TORCH_LIBRARY)
    if(EXISTS "${torch_cpu}")
      execute_process(COMMAND readelf -d "${torch_cpu}" OUTPUT_VARIABLE torch_needs
        ERROR_QUIET)
      if(torch_needs MATCHES "libgloo\\.so\\.0")
        set_target_properties(gloo PROPERTIES IMPORTED_LOCATION_RELWITHDEBINFO
          "${TRAINYARD_MACHINE_GLOO}" IMPORTED_LOCATION "${TRAINYARD_MACHINE_GLOO}")
        message(STATUS "Gloo: the machine's ${TRAINYARD_MACHINE_GLOO}, which its LibTorch loads")
      endif()
    endif()
  endif()
endfunction()
